"""A sweep on SageMaker: one data-only training job serving N DNN-only training jobs, each with its own
hyperparameters, through one registry.

``hetero sweep`` (hetero/sagemaker/jobs.py) turns its options into these ``JobSpec``s:

* ``<sweep>-data``: one instance group of data nodes, hyperparameters ``join=<registry>`` (its
  servers register there), ``batch_window`` (each batch built once for the jobs of one seed) and
  ``watchdog_idle_s`` (it exits once the last job has been gone that long: a data-only job never
  bills idle for long), plus the sweep's common hyperparameters (the pipeline and its options);
* ``<sweep>-<k>``: one instance group of DNN nodes each, ``registry=<registry>`` (their consumers
  use every server registered there), the common hyperparameters and the job's own.

All of them carry ``job_name=<sweep>`` and the same job secret, so every node derives the same
job token (HMAC of the secret and the sweep's name) and the data servers accept the jobs' ranks.
They run in one VPC (the jobs' ranks dial the data nodes across jobs). A job's own
hyperparameters must leave the pipeline alone: the data group serves one pipeline, and a
consumer refuses servers of another fingerprint.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from hetero.sagemaker.spec import DATA, DNN, Group, JobSpec, SubmitError

PIPELINE_KEYS = ("pipeline", "pipeline_options")
MAX_JOBS = 100


@dataclass(frozen=True)
class Sweep:
    """What makes a sweep of one ``JobSpec``: its name (the token's), registry, the data group's
    batch window and idle timeout, and each DNN job's own hyperparameters."""

    name: str
    registry: str
    batch_window: int  # bytes (0: no window)
    idle_s: float
    jobs: tuple[tuple[tuple[str, str], ...], ...]  # each job's own hyperparameters, as (key, value) pairs

    def __post_init__(self) -> None:
        if not 1 <= len(self.jobs) <= MAX_JOBS:
            raise SubmitError(f"a sweep of {len(self.jobs)} jobs: give 1 to {MAX_JOBS} (--jobs N, --vary K=V1,V2 "
                              "or --job K=V)")
        if not self.idle_s > 0:
            raise SubmitError(f"--idle-timeout {self.idle_s:g} must be > 0 seconds: the data job exits once the last "
                              "job has been gone that long")
        for own in self.jobs:
            touched = [k for k, _ in own if k in PIPELINE_KEYS or k.startswith("pipeline.")]
            if touched:
                raise SubmitError(f"job hyperparameters {touched} change the pipeline, but the sweep's data group "
                                  "serves one pipeline: set it for all with --hyperparameters, or run another sweep")


def grid(vary: list[str], jobs: int = 0) -> list[dict[str, str]]:
    """Each job's own hyperparameters: every combination of ``--vary KEY=V1,V2,...`` values, or,
    with none, ``jobs`` jobs with none of their own."""
    axes = []
    for item in vary:
        key, sep, values = item.partition("=")
        options = [v for v in values.split(",") if v != ""]
        if not sep or not key or not options:
            raise SubmitError(f"--vary {item!r} must look like KEY=V1,V2,... e.g. lr=0.1,0.01")
        axes.append([(key, v) for v in options])
    if axes:
        if jobs and jobs != len(list(itertools.product(*axes))):
            raise SubmitError(f"--jobs {jobs} but --vary makes {len(list(itertools.product(*axes)))} jobs; give one")
        return [dict(combo) for combo in itertools.product(*axes)]
    if jobs < 1:
        raise SubmitError("how many jobs? give --jobs N, --vary KEY=V1,V2,... or --job K=V[,K=V]")
    return [{} for _ in range(jobs)]


def sweep_hyperparameters(common: dict[str, str], sweep: Sweep) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The data-only job's hyperparameters, and each DNN-only job's, from the sweep's ``common``
    ones (``hetero sweep`` submits these; ``hetero local --jobs`` runs them as processes)."""
    common = {**common, "job_name": sweep.name}
    data = {**common, "join": sweep.registry, "batch_window": str(sweep.batch_window),
            "watchdog_idle_s": f"{sweep.idle_s:g}"}
    return data, [{**common, "registry": sweep.registry, **dict(own)} for own in sweep.jobs]


def data_job_name(sweep: Sweep) -> str:
    return f"{sweep.name}-data"


def dnn_job_names(sweep: Sweep) -> list[str]:
    width = len(str(len(sweep.jobs) - 1))
    return [f"{sweep.name}-{k:0{width}d}" for k in range(len(sweep.jobs))]


def sweep_specs(base: JobSpec, data_group: Group, dnn_group: Group, sweep: Sweep,
                data_image: str | None = None) -> list[JobSpec]:
    """The data-only job, then one DNN-only job per entry of ``sweep.jobs``, made from ``base`` (its
    role, image, output, code, secret, VPC, stopping condition, common hyperparameters; its channels
    go to the data job, which reads the data set). The data job runs ``data_image`` when given (the
    CPU image for its CPU nodes), else ``base``'s.

    Raises:
        SubmitError: no VPC, or a group of the wrong role.
    """
    if not base.vpc:
        raise SubmitError("a sweep runs in a VPC: the jobs' ranks dial the data job's nodes across jobs; give "
                          "--subnet subnet-... --security-group sg-... (see docs/elastic.md for the network set-up)")
    if data_group.role != DATA or dnn_group.role != DNN:
        raise SubmitError("a sweep needs a data group (--data-group) and a DNN group (--dnn-group)")
    data_hps, dnn_hps = sweep_hyperparameters(base.hyperparameters, sweep)
    data = base.copy(job_name=data_job_name(sweep), groups=[data_group], hyperparameters=data_hps,
                     image=data_image or base.image,
                     tags={**base.tags, "hetero:mode": "sweep-data", "hetero:sweep": sweep.name})
    specs = [data]
    for name, hps in zip(dnn_job_names(sweep), dnn_hps):
        specs.append(base.copy(job_name=name, groups=[dnn_group], channels=[], hyperparameters=hps,
                               tags={**base.tags, "hetero:mode": "sweep-dnn", "hetero:sweep": sweep.name}))
    for spec in specs[1:]:  # one secret for all: every node derives the sweep's token
        spec.job_secret, spec.job_secret_arn = data.job_secret, data.job_secret_arn
    too_long = [s.job_name for s in specs if len(s.job_name) > 63]
    if too_long:
        raise SubmitError(f"job names {too_long} are longer than SageMaker's 63 characters: give a shorter --job-name")
    return specs
