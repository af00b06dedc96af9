"""``hetero prepare`` as a SageMaker training job: N instances, one ``--part i/N`` each, then the merge.

The job reads SRC (an image folder in S3, ``s3://bucket/prefix/<class>/*.jpg``) through a
FastFile channel, so every instance sees every file name and reads only its own part's files, and
writes shards to DEST (``s3://``). Instance ``i`` of the sorted hosts writes part ``i/N``; the
first host then waits for every part's manifests (a deadline: the job's run time) and writes the
index. A part that SageMaker restarts (or a job started again with the same DEST and options)
keeps the shards already written. The request is checked against botocore's service model and the
API's rules (:func:`hetero.sagemaker.validate.check_request`) before anything is sent.
"""
from __future__ import annotations

import os
import time
from typing import cast

from hetero.sagemaker.spec import Channel, Group, JobSpec, SubmitError, check_s3_uri

ENTRY = "hetero/sagemaker/prepare_entry.py"
CHANNEL = "source"
POLL_S = 10.0


def prepare_spec(src: str, dest: str, *, instance_type: str, count: int, role: str, image: str, output: str,
                 region: str, job_name: str, source_s3: str, shard_size: int = 256 * 1000**2, max_side: int = 0,
                 shuffle_seed: int | None = 0, volume_gb: int = 100, max_run_s: int = 24 * 3600,
                 spot: bool = False) -> JobSpec:
    """The job that prepares ``src`` into ``dest`` on ``count`` instances of ``instance_type``.

    Raises:
        SubmitError: SRC or DEST not an ``s3://`` URI, a count below 1.
    """
    check_s3_uri(src, "SRC")
    check_s3_uri(dest, "DEST")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SubmitError(f"--sagemaker {count!r} must be the number of instances, >= 1")
    hps = {"sagemaker_program": ENTRY, "dest": dest, "shard_size": str(shard_size), "max_side": str(max_side),
           "shuffle_seed": "none" if shuffle_seed is None else str(shuffle_seed), "merge_wait_s": str(max_run_s)}
    return JobSpec(job_name=job_name, role=role, image=image, groups=[Group("homogeneousCluster", instance_type,
                                                                              count)],
                   output=output, region=region, homogeneous=True,
                   channels=[Channel(CHANNEL, src, input_mode="FastFile")], hyperparameters=hps,
                   max_run_s=max_run_s, spot=spot, volume_gb=volume_gb, source_s3=source_s3,
                   tags={"hetero:mode": "prepare"})


def prepare_request(spec: JobSpec) -> dict:
    """The CreateTrainingJob request of ``spec``, checked (SubmitError listing what SageMaker would reject)."""
    from hetero.sagemaker.request import build_request
    from hetero.sagemaker.validate import check_request

    request = build_request(spec)
    request["Environment"] = {}  # no data servers: no job secret to carry
    check_request(request)
    return request


def run_part(root: str = "/opt/ml", environ=None) -> int:
    """In the container: write this host's part, and on the first host merge once every part is done."""
    from data_service.storage import open_store
    from data_service.prepare.writer import merge_parts, prepare
    from data_service.prepare.plan import PLAN, finished, read_plan
    from launcher.job.roles import host_key
    from launcher.job.sm_env import load_env

    env = load_env(root, os.environ if environ is None else environ)
    hps = env.hyperparameters
    hosts = sorted(env.hosts, key=host_key)
    part = (hosts.index(env.current_host), len(hosts))
    src = env.channels.get(CHANNEL)
    if not src:
        raise SubmitError(f"no {CHANNEL!r} input channel on this node (channels: {sorted(env.channels)})")
    seed = str(hps.get("shuffle_seed", "0"))
    dest = str(hps["dest"])
    summary = prepare(src, dest, shard_size=int(hps.get("shard_size", 256 * 1000**2)),
                      max_side=int(hps.get("max_side", 0)), shuffle_seed=None if seed == "none" else int(seed),
                      workers=int(hps.get("workers", 0)), part=part, progress=True)
    print("\n".join(summary.lines(dest)), flush=True)
    if part[0] != 0:
        return 0
    store = open_store(dest, what="dest")
    deadline = time.monotonic() + float(hps.get("merge_wait_s", 24 * 3600))
    while True:
        plan = read_plan(store)
        if plan is not None and len(finished(store)) >= plan.shards:
            break
        if time.monotonic() > deadline:
            raise SubmitError(f"{dest}: parts still unfinished after merge_wait_s; run `hetero prepare --merge "
                              f"{dest}` once they are done ({PLAN} lists the run)")
        time.sleep(float(hps.get("merge_poll_s", POLL_S)))
    merged = merge_parts(store)
    print("\n".join(merged.lines(dest)), flush=True)
    return 0


def submit(spec: JobSpec, region: str, dry_run: bool = False) -> tuple[dict, str]:
    """Check ``spec``'s request; unless ``dry_run``, upload this checkout as its source and create the job.

    Returns:
        (the request, with nothing secret in it; the job's ARN, "" for a dry run).
    """
    request = prepare_request(spec)
    if dry_run:
        return request, ""
    from hetero.sagemaker.client import Clients
    from hetero.sagemaker.source import build_sourcedir, upload_source

    clients = Clients(region)
    archive, digest = build_sourcedir()
    upload_source(clients.s3, archive, cast(str, spec.source_s3), digest)  # prepare_spec sets it
    return request, clients.sagemaker.create_training_job(**request)["TrainingJobArn"]
