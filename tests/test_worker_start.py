"""Data workers fork from the pool's warm parent (torch and the pipeline module imported once),
replacements too; each gets the server's environment of when it starts; a pipeline module that
cannot be preloaded falls back to spawn with a log line saying why."""
from __future__ import annotations

import logging
import os
import signal
import sys
import time

import psutil
import pytest

from _env_pipeline import VAR
from conftest import TOKEN
from data_service.contract.batch_id import BatchId
from data_service.contract.pipeline import PipelineSpec
from data_service.contract.tensor_layout import batch_digest
from data_service.errors import ConfigError
from data_service.protocol.generated import pb
from data_service.server import DataServer, ServerOptions
from dnn_worker.fetch.fetch_options import FetchOptions
from dnn_worker.fetch.fetcher import Fetcher
from hetero.testing import Reference

pytestmark = pytest.mark.timeout(180)
OPTS = {"size": 64, "batch_size": 4}  # 16 batches per epoch


def _server(target: str, opts: dict = OPTS, workers: int = 2, **kw) -> DataServer:
    return DataServer(PipelineSpec(target, opts), TOKEN, ServerOptions(num_workers=workers, probe=False, **kw)).start()


def _batches(server: DataServer, epoch: int, count: int = 16) -> dict:
    refs = [BatchId(5, epoch, i) for i in range(count)]
    return {r.index: b for r, b in Fetcher([server.address], refs, FetchOptions(TOKEN, window=2, batch_timeout=60))}


def _digests(server: DataServer, epoch: int) -> list[str]:
    got = _batches(server, epoch)
    return [batch_digest(got[i]) for i in range(len(got))]


def _parents(server: DataServer) -> set[int]:
    return {psutil.Process(pid).ppid() for pid in server.pool.worker_pids()}


def _kill_and_wait_replaced(server: DataServer, workers: int, timeout: float = 60.0) -> None:
    victim = server.pool.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = server.pool.worker_pids()
        if len(pids) == workers and victim not in pids and server.pool.state.replacing == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"killed worker {victim} was not replaced within {timeout:.0f}s: {server.pool.worker_pids()}")


def test_workers_fork_from_the_warm_parent_and_a_killed_one_is_replaced_from_it():
    ref = Reference("examples.synthetic:build_pipeline", OPTS, 5)
    server = _server("examples.synthetic:build_pipeline")
    try:
        warm = server.pool.starter.parent.process.pid
        assert server.pool.starter.method == "warm" and _parents(server) == {warm}
        assert _digests(server, 0) == ref.digests(0)
        _kill_and_wait_replaced(server, 2)
        assert _parents(server) == {warm}
        assert _digests(server, 1) == ref.digests(1)
    finally:
        server.shutdown(grace_s=0.5)
    assert not psutil.pid_exists(warm) or psutil.Process(warm).status() == psutil.STATUS_ZOMBIE


def test_the_warm_parent_holds_no_thread_grpc_or_socket_of_the_server_and_only_what_the_pipeline_imports():
    server = _server("examples.synthetic:build_pipeline")
    try:
        warm = psutil.Process(server.pool.starter.parent.process.pid)
        deadline = time.monotonic() + 60
        while server.pool.starter.spare_pid is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the spare's fork request passes its pipe's end through the warm parent
        assert "grpc" in sys.modules and psutil.Process().num_threads() > 1  # what the server holds
        assert warm.num_threads() == 1
        with open(f"/proc/{warm.pid}/maps") as f:
            maps = f.read()
        assert "libtorch" in maps  # preloaded
        assert "grpc" not in maps and "torchvision" not in maps, "loaded only what the synthetic pipeline imports"
        fds = [os.readlink(f"/proc/{warm.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{warm.pid}/fd")]
        assert len([fd for fd in fds if fd.startswith("socket:")]) == 1, fds  # its control socket only
    finally:
        server.shutdown(grace_s=0.5)


def test_each_worker_gets_the_servers_environment_of_when_it_starts(monkeypatch):
    def marks(server: DataServer, epoch: int) -> set[int]:
        return {int(v) for b in _batches(server, epoch, 4).values() for v in b["mark"].tolist()}

    monkeypatch.setenv(VAR, "1")
    first = _server("_env_pipeline:build_pipeline", {"batch_size": 4}, workers=1)
    try:
        assert marks(first, 0) == {1}
    finally:
        first.shutdown(grace_s=0.5)
    monkeypatch.setenv(VAR, "2")  # a second server in the same process
    second = _server("_env_pipeline:build_pipeline", {"batch_size": 4}, workers=1)
    try:
        assert second.pool.starter.method == "warm"
        assert marks(second, 0) == {2}
        monkeypatch.setenv(VAR, "3")  # changed while the pool runs: the replacement sees it, as a spawned one would
        _kill_and_wait_replaced(second, 1)
        assert marks(second, 1) == {3}
    finally:
        second.shutdown(grace_s=0.5)


def test_spawn_when_asked_makes_the_workers_children_of_the_server():
    server = _server("examples.synthetic:build_pipeline", worker_start="spawn")
    try:
        assert server.pool.starter.method == "spawn" and _parents(server) == {os.getpid()}
    finally:
        server.shutdown(grace_s=0.5)


@pytest.mark.slow
def test_a_pipeline_module_that_cannot_be_preloaded_falls_back_to_spawn_saying_why(caplog):
    caplog.set_level(logging.WARNING, logger="data_service.pool.warm_start")
    server = _server("_unpreloadable_pipeline:build_pipeline")
    try:
        assert server.pool.starter.method == "spawn" and _parents(server) == {os.getpid()}
        said = [r.getMessage() for r in caplog.records if "spawn" in r.getMessage()]
        assert said and "_unpreloadable_pipeline" in said[0] and "device context" in said[0], said
        assert _digests(server, 0) == Reference("examples.synthetic:build_pipeline", OPTS, 5).digests(0)
    finally:
        server.shutdown(grace_s=0.5)


@pytest.mark.parametrize("method", ["warm", "spawn"])
@pytest.mark.slow
def test_a_killed_worker_s_log_line_names_the_signal_even_when_its_pipe_broke_first(caplog, tmp_path, method):
    caplog.set_level(logging.WARNING, logger="data_service.pool.worker_pool")
    opts = {"die_at": 5, "marker": str(tmp_path / "died")}
    server = _server("_dying_pipeline:build_pipeline", opts, workers=1, worker_start=method)
    try:
        victim = server.pool.worker_pids()[0]
        got = _batches(server, 0, count=4)  # batch 1 holds sample 5: its worker dies, a new one builds it
        assert sorted(got) == [0, 1, 2, 3] and got[1]["x"].tolist() == [4, 5, 6, 7]
        deadline = time.monotonic() + 10  # the line comes once the status is known, from another thread
        while time.monotonic() < deadline and not [r for r in caplog.records if f"(pid {victim})" in r.getMessage()]:
            time.sleep(0.05)
        said = [r.getMessage() for r in caplog.records if f"(pid {victim})" in r.getMessage()]
        assert said == [f"data worker 0 (pid {victim}) was killed by SIGKILL (-9) while building epoch 0 batch 1"]
    finally:
        server.shutdown(grace_s=0.5)


def test_an_unknown_start_method_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"worker_start='fork'.*warm, spawn"):
        ServerOptions(worker_start="fork")


def test_a_server_started_in_a_process_holding_over_a_thousand_descriptors_forks_its_workers():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1400:
        pytest.skip(f"the descriptor limit here is {hard}: a process cannot hold 1,100 more")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1400), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # a trainer's files, a long test run's
    try:
        server = _server("examples.synthetic:build_pipeline")
        try:
            assert server.pool.starter.method == "warm"
            assert len(_batches(server, 0, count=4)) == 4
            assert os.getpid() not in _parents(server)  # forked from the warm parent, not spawned
        finally:
            server.shutdown(grace_s=0.5)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
