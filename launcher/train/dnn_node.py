"""The DNN node: wait for the data servers, train with DDP, then shut every data server down.

A DNN-only job reading a data group it does not own (a sweep's, ``NodeAssignment.shared_group``)
waits for its registry to list a server, and shuts none down: the other jobs still read from
them, and the group ends on its own idle timeout once the last job is gone.

One trainer process per local GPU (``procs_per_node`` overrides; 1 on CPU), ranks numbered
``node_rank * nprocs + local_rank`` across all DNN hosts, MASTER_ADDR = the first DNN host,
as in multi-node SageMaker DDP. After a successful run the node with ``node_rank`` 0 shuts
every data server down; after a failed run *any* DNN node does (the call is authenticated
and idempotent), then exits non-zero.

SIGTERM (SageMaker: spot interruption, StopTrainingJob, MaxRuntime): forwarded to the trainer
processes, which finish the current step, write a checkpoint and return; then every DNN node
shuts the data servers down, as after a failure, and exits ``EXIT_STOPPED`` (143).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.multiprocessing as mp
# from the module that exports them: torch.multiprocessing's __all__ leaves them out (mypy: not re-exported)
from torch.multiprocessing.spawn import ProcessExitedException, start_processes

from data_service.errors import ServerUnavailableError
from dnn_worker import ControlClient

from .. import log_setup as logs
from . import trainer as trainer_mod
from .trainer import EXIT_STOPPED, TrainJob, train

log = logging.getLogger(__name__)

EXIT_TRAINING_FAILED = 1
EXIT_GRACE_S = 30.0  # a trainer killed in teardown: how long the others get to finish and report
_trainer_pids: list[int] = []   # spawned trainer processes, for forwarding SIGTERM


def _on_sigterm(signum, frame) -> None:
    trainer_mod.request_stop()
    for pid in list(_trainer_pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def install_sigterm_handler() -> bool:
    """SIGTERM -> stop after the current step and checkpoint (main thread only; else False)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def wait_servers(addresses: list[str], token: str, deadline_s: float) -> None:
    """Block until every data server answers an authenticated Hello, or raise.

    Raises:
        ServerUnavailableError: naming every server that did not answer within ``deadline_s``.
    """
    end = time.monotonic() + deadline_s

    def one(address: str) -> str | None:
        with ControlClient(address, token, "launcher") as ctl:
            while True:  # in short tries, so a SIGTERM (the job is being stopped) ends the wait
                try:
                    ctl.wait_hello(max(0.2, min(2.0, end - time.monotonic())))
                    return None
                except ServerUnavailableError as exc:
                    if time.monotonic() >= end:
                        return f"last try: {exc}"
                    if trainer_mod.STOP.is_set():
                        return "SIGTERM while waiting"

    with ThreadPoolExecutor(max_workers=max(1, len(addresses))) as pool:
        errors = [e for e in pool.map(one, addresses) if e]
    if trainer_mod.STOP.is_set():
        return  # the caller reports the stop
    if errors:
        raise ServerUnavailableError(f"{len(errors)} of {len(addresses)} data server(s) not healthy within "
                                     f"data_wait_s={deadline_s:g}s: " + " | ".join(errors))
    log.info("all %d data server(s) healthy: %s", len(addresses), ", ".join(addresses))


def wait_registry(uri: str, token: str, fingerprint: str, deadline_s: float) -> list[str]:
    """Block until the registry ``uri`` lists a data server of this job's token and pipeline that
    answers a Hello; returns those listed then.

    Raises:
        ServerUnavailableError: none within ``deadline_s``, naming the registry.
    """
    from dnn_worker.fetch.registry_watch import registered_servers

    end = time.monotonic() + deadline_s
    while True:
        listed = registered_servers(uri, token, fingerprint)
        if listed:
            wait_servers(listed, token, max(1.0, end - time.monotonic()))
            return listed
        if trainer_mod.STOP.is_set():
            return []
        if time.monotonic() >= end:
            raise ServerUnavailableError(
                f"registry {uri} listed no data server of this job's token and pipeline within data_wait_s="
                f"{deadline_s:g}s: start the sweep's data job (its join= must name this registry, its job_name "
                "this job's job_name, and its pipeline options these)")
        time.sleep(max(0.05, min(1.0, end - time.monotonic())))


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
    """Run ``train`` on ``job.nprocs`` local ranks: 0 when all complete, ``EXIT_STOPPED`` when
    they stopped on SIGTERM (checkpoint written), else ``EXIT_TRAINING_FAILED``."""
    if job.nprocs == 1:
        try:
            summary = train(0, job)
            return EXIT_STOPPED if summary.get("status") == "stopped" else 0
        except Exception:
            log.exception("training failed")
            return EXIT_TRAINING_FAILED
        finally:
            logs.setup("dnn", job.host, level=job.cfg.job.log_level)  # train() set the rank's format
    results = mp.get_context("spawn").SimpleQueue()
    context = start_processes(train, args=(job, results), nprocs=job.nprocs, join=False, start_method="spawn")
    _trainer_pids[:] = context.pids()
    if trainer_mod.STOP.is_set():  # SIGTERM came while they started
        _on_sigterm(signal.SIGTERM, None)
    deadline = time.monotonic() + timeout_s
    statuses: dict[int, str] = {}

    def drain() -> None:
        while not results.empty():
            local_rank, status = results.get()
            statuses[local_rank] = status

    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                log.error("training ran past train_timeout_s=%gs; stopping the trainers", timeout_s)
                return EXIT_TRAINING_FAILED
        drain()
        return EXIT_STOPPED if "stopped" in statuses.values() else 0
    except ProcessExitedException as exc:
        # A process killed by a signal after it reported its final status (checkpoint written,
        # metrics sent, past the last barrier) died in interpreter teardown (a C++ thread of the
        # collective backend aborting at exit): its work is complete. Give the others the time to
        # report before deciding.
        end = time.monotonic() + EXIT_GRACE_S
        for p in context.processes:
            p.join(max(0.0, end - time.monotonic()))
        drain()
        if len(statuses) == job.nprocs:
            log.warning("trainer %d exited with %s after it had finished and reported (%s); every rank's work is "
                        "complete, so the node carries on", exc.error_index, _exit_name(exc),
                        statuses.get(exc.error_index, "?"))
            return EXIT_STOPPED if "stopped" in statuses.values() else 0
        log.error("a trainer process failed: %s", exc)
        return EXIT_TRAINING_FAILED
    except Exception as exc:  # ProcessRaisedException
        log.error("a trainer process failed: %s", exc)
        return EXIT_TRAINING_FAILED
    finally:
        _trainer_pids.clear()
        for p in context.processes:
            if p.is_alive():
                p.terminate()
        for p in context.processes:
            p.join(10)


def _exit_name(exc: ProcessExitedException) -> str:
    return f"signal {exc.signal_name}" if getattr(exc, "signal_name", None) else f"exit code {exc.exit_code}"


def run_dnn_node(job: TrainJob, data_wait_s: float, local_server=None) -> int:
    """Wait for data (heterogeneous), train, shut data servers down. Returns the exit code:
    0, ``EXIT_STOPPED`` (SIGTERM: checkpoint written) or ``EXIT_TRAINING_FAILED``."""
    servers = list(job.servers)
    rc = EXIT_TRAINING_FAILED
    install_sigterm_handler()
    try:
        if job.shared_group:
            wait_registry(job.cfg.elastic.registry, job.token, trainer_mod.pipeline_fingerprint(job.cfg), data_wait_s)
        elif job.mode == "heterogeneous":
            wait_servers(servers, job.token, data_wait_s)
        if trainer_mod.STOP.is_set():
            log.warning("SIGTERM before training started: nothing trained, nothing to checkpoint")
            rc = EXIT_STOPPED
        else:
            rc = run_trainers(job, job.cfg.dnn.train_timeout_s)
    except Exception:
        log.exception("DNN node failed before training finished")
        rc = EXIT_TRAINING_FAILED
    finally:
        if job.shared_group:
            log.info("the data group is shared (registry %s): left serving the other jobs; it ends on its idle "
                     "timeout", job.cfg.elastic.registry)
        elif job.mode == "heterogeneous":
            remote = [a for h, a in zip(job.server_hosts, servers) if h != job.host]
            if job.cfg.elastic.registry:  # servers that joined through the registry leave with the job's own
                from dnn_worker.fetch.registry_watch import registered_servers
                remote += [a for a in registered_servers(job.cfg.elastic.registry, job.token) if a not in remote]
            if rc == EXIT_STOPPED:
                shutdown_servers(remote, job.token, f"training stopped by SIGTERM on {job.host} (checkpoint written)")
            elif rc != 0:
                shutdown_servers(remote, job.token, f"training failed on {job.host}")
            elif job.node_rank == 0:
                shutdown_servers(remote, job.token, "training finished")
        if local_server is not None:
            local_server.shutdown(grace_s=5.0, reason="DNN node done")
    log.info("DNN node exits with %d", rc)
    return rc
