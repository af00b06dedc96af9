"""The DNN node: wait for the data servers, train with DDP, then shut every data server down.

One trainer process per local GPU (``procs_per_node`` overrides; 1 on CPU), ranks numbered
``node_rank * nprocs + local_rank`` across all DNN hosts, MASTER_ADDR = the first DNN host,
as in multi-node SageMaker DDP. After a successful run the node with ``node_rank`` 0 shuts
every data server down; after a failed run *any* DNN node does (the call is authenticated
and idempotent), then exits non-zero.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.multiprocessing as mp

from data_service.errors import ServerUnavailableError
from dnn_worker import ControlClient

from . import logs
from .trainer import TrainJob, train

log = logging.getLogger(__name__)

EXIT_TRAINING_FAILED = 1


def wait_servers(addresses: list[str], token: str, deadline_s: float) -> None:
    """Block until every data server answers an authenticated Hello, or raise.

    Raises:
        ServerUnavailableError: naming every server that did not answer within ``deadline_s``.
    """
    def one(address: str) -> str | None:
        with ControlClient(address, token, "launcher") as ctl:
            try:
                ctl.wait_hello(deadline_s)
                return None
            except ServerUnavailableError as exc:
                return str(exc)

    with ThreadPoolExecutor(max_workers=max(1, len(addresses))) as pool:
        errors = [e for e in pool.map(one, addresses) if e]
    if errors:
        raise ServerUnavailableError(f"{len(errors)} of {len(addresses)} data server(s) not healthy within "
                                     f"data_wait_s={deadline_s:g}s: " + " | ".join(errors))
    log.info("all %d data server(s) healthy: %s", len(addresses), ", ".join(addresses))


def shutdown_servers(addresses: list[str], token: str, reason: str, grace_s: float = 30.0) -> list[str]:
    """Authenticated Shutdown to every server; returns the ones that could not be reached."""
    failed = []
    for address in addresses:
        try:
            with ControlClient(address, token, "launcher") as ctl:
                ctl.shutdown(grace_s=grace_s, reason=reason, timeout=10.0)
            log.info("asked data server %s to shut down (%s)", address, reason)
        except Exception as exc:  # keep going: every server must be asked
            log.warning("could not shut down data server %s: %s", address, exc)
            failed.append(address)
    return failed


def local_procs(requested: int, sm_num_gpus: int | None) -> int:
    """Trainer processes on this node: the option, else one per GPU, else 1."""
    if requested:
        return requested
    gpus = sm_num_gpus if sm_num_gpus is not None else torch.cuda.device_count()
    return max(1, gpus)


def run_trainers(job: TrainJob, timeout_s: float) -> int:
    """Run ``train`` on ``job.nprocs`` local ranks; 0 when all succeed, else non-zero."""
    if job.nprocs == 1:
        try:
            train(0, job)
            return 0
        except Exception:
            log.exception("training failed")
            return EXIT_TRAINING_FAILED
        finally:
            logs.setup("dnn", job.host, level=job.cfg.log_level)  # train() set the rank's format
    context = mp.start_processes(train, args=(job,), nprocs=job.nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                log.error("training ran past train_timeout_s=%gs; stopping the trainers", timeout_s)
                return EXIT_TRAINING_FAILED
        return 0
    except Exception as exc:  # ProcessRaisedException / ProcessExitedException
        log.error("a trainer process failed: %s", exc)
        return EXIT_TRAINING_FAILED
    finally:
        for p in context.processes:
            if p.is_alive():
                p.terminate()
        for p in context.processes:
            p.join(10)


def run_dnn_node(job: TrainJob, data_wait_s: float, local_server=None) -> int:
    """Wait for data (heterogeneous), train, shut data servers down. Returns the exit code."""
    servers = list(job.servers)
    rc = EXIT_TRAINING_FAILED
    try:
        if job.mode == "heterogeneous":
            wait_servers(servers, job.token, data_wait_s)
        rc = run_trainers(job, job.cfg.train_timeout_s)
    except Exception:
        log.exception("DNN node failed before training finished")
        rc = EXIT_TRAINING_FAILED
    finally:
        if job.mode == "heterogeneous":
            remote = [a for h, a in zip(job.server_hosts, servers) if h != job.host]
            if rc != 0:
                shutdown_servers(remote, job.token, f"training failed on {job.host}")
            elif job.node_rank == 0:
                shutdown_servers(remote, job.token, "training finished")
        if local_server is not None:
            local_server.shutdown(grace_s=5.0, reason="DNN node done")
    log.info("DNN node exits with %d", rc)
    return rc
