"""``hetero local --jobs N`` / ``--vary K=V1,V2``: a sweep on one machine, as ``hetero sweep`` submits it.

One data-only job (its nodes serve the sweep's registry with a batch window and end on their
idle timeout) and one DNN-only job per combination of values, each its own emulated SageMaker
job: its own nodes, host names, resourceconfig.json and ``TRAINING_JOB_NAME``, with the
hyperparameters ``hetero.sagemaker.sweep.sweep_hyperparameters`` gives the submitted jobs, and
one job secret for all (every node derives the sweep's token). The jobs read one data group:
jobs of one seed get each batch built once (docs/sweep.md).

    result = run_local_sweep(LocalJob(dnn_nodes=1, output=Path("out")), vary=["lr=0.1,0.01"])
    result.jobs["<name>-0"].metrics
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_service.errors import ConfigError
from data_service.server.batch_window import window_budget

from .job import LocalJob, LocalResult, check_data, training_data, work_tree
from .runner import LocalCluster
from .tree import DATA_GROUP, DNN_GROUP, parse_cpus, write_nodes

log = logging.getLogger(__name__)


@dataclass
class SweepResult:
    """Each DNN job's result by job name, and the data job's (exit codes; ``data_nodes``: each
    data node's ``data_node.json``: batches built, the window's counters)."""

    name: str
    jobs: dict[str, LocalResult]
    data: LocalResult
    data_nodes: dict[str, dict[str, Any]]
    output: Path

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.jobs.values()) and all(c == 0 for c in self.data.exit_codes.values())


def run_local_sweep(job: LocalJob, vary: list[str] | None = None, jobs: int = 0, batch_window: str = "1GB",
                    idle_s: float = 10.0) -> SweepResult:
    """Run the sweep's data job and its DNN jobs as processes; returns when every job ended (the
    data job on its idle timeout, once the last DNN job is gone).

    Raises:
        ConfigError: a bad sweep (no jobs, a job that changes the pipeline, a bad size), or an
            option a sweep cannot take.
    """
    from hetero.sagemaker.spec import SubmitError
    from hetero.sagemaker.sweep import Sweep, data_job_name, dnn_job_names, grid, sweep_hyperparameters

    if job.homogeneous or job.registry is not None or job.sigterm_on:
        raise ConfigError("--jobs/--vary run a sweep (a data-only job and DNN-only jobs over the sweep's own "
                          "registry): drop --homogeneous, --registry and --sigterm-on")
    if job.data_nodes < 1 or job.dnn_nodes < 1:
        raise ConfigError(f"--data-nodes {job.data_nodes} --dnn-nodes {job.dnn_nodes}: a sweep needs at least one "
                          "of each (the data job's nodes, and each DNN job's)")
    check_data(job)
    output = Path(job.output).resolve()
    name = f"local-sweep-{int(time.time())}-{os.getpid()}"
    registry = output / "registry"
    common = {"advertise_host": "127.0.0.1", **job.common_hyperparameters()}
    window = window_budget(batch_window)  # a bad size fails here, before anything is written or started
    try:
        sweep = Sweep(name, str(registry), window, idle_s,
                      tuple(tuple(sorted(own.items())) for own in grid(vary or [], jobs)))
    except SubmitError as exc:
        raise ConfigError(str(exc)) from None
    shutil.rmtree(registry, ignore_errors=True)  # entries of an earlier run name servers long gone
    registry.mkdir(parents=True)
    data_hps, dnn_hps = sweep_hyperparameters(common, sweep)
    names = dnn_job_names(sweep)
    data_cpus, dnn_cpus = parse_cpus(job.data_cpus), parse_cpus(job.dnn_cpus)
    secret = secrets.token_hex(16)  # one for all: every node derives the sweep's token
    clusters: dict[str, LocalCluster] = {}
    with work_tree(job, "hetero-local-sweep-") as work:
        data_dir = training_data(job, work)
        audits = Path(job.audit).resolve() if job.audit is not None else None  # a folder: one log per job
        layouts = {data_job_name(sweep): ([(DATA_GROUP, "data", job.data_nodes)], data_hps)}
        for job_name, hps in zip(names, dnn_hps):
            if audits is not None:
                audits.mkdir(parents=True, exist_ok=True)
                hps = {**hps, "audit_path": str(audits / f"{job_name}.jsonl")}
            layouts[job_name] = ([(DNN_GROUP, "dnn", job.dnn_nodes)], hps)
        for job_name, (layout, hps) in layouts.items():
            checkpoints = Path(job.checkpoint_dir) / job_name if job.checkpoint_dir is not None else None
            nodes = write_nodes(work / job_name, layout, data_dir, hps, job_name, data_cpus, dnn_cpus, checkpoints,
                                None, secret)
            clusters[job_name] = LocalCluster(nodes, hps, output / job_name / "logs", echo=job.echo,
                                             label=job_name)
        log.info("sweep %s: data job %s and %d DNN job(s) %s over registry %s", name, data_job_name(sweep),
                 len(names), ", ".join(names), registry)
        for cluster in clusters.values():  # the data job first, as hetero sweep submits it
            cluster.start()
        deadline = time.monotonic() + job.timeout_s
        results: dict[str, LocalResult] = {}
        try:
            for job_name in names:
                cluster = clusters[job_name]
                codes = cluster.wait(max(1.0, deadline - time.monotonic()))
                path = cluster.collect(output / job_name)
                metrics = json.loads(path.read_text()) if path is not None else None
                results[job_name] = LocalResult(codes, metrics, output / job_name, cluster.failure)
            data = clusters[data_job_name(sweep)]
            # no trainer in the data job: its nodes end on the idle timeout, bounded here
            left = max(1.0, deadline - time.monotonic())
            codes = data.wait(left, data_grace_s=min(left, idle_s + 60.0))
        finally:
            for cluster in clusters.values():
                cluster.stop()
        data.collect(output / data_job_name(sweep))
        nodes_json = {n.host: json.loads((n.output_dir / "data_node.json").read_text())
                      for n in data.nodes if (n.output_dir / "data_node.json").is_file()}
        return SweepResult(name, results, LocalResult(codes, None, output / data_job_name(sweep), data.failure),
                           nodes_json, output)
