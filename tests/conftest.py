"""Shared fixtures: real data servers on free loopback ports, real worker processes."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_service.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-token"

# A server stopping in the background may log after pytest closed its capture stream;
# that is not an error of the code under test.
logging.raiseExceptions = False


def start_server(options: dict | None = None, token: str = TOKEN, **server_options) -> DataServer:
    spec = PipelineSpec("examples.synthetic:build_pipeline", options or {"size": 100, "batch_size": 8})
    server_options.setdefault("num_workers", 2)
    return DataServer(spec, token, ServerOptions(**server_options)).start()


@pytest.fixture
def server_factory():
    """Start servers with ``server_factory(pipeline_options, **server_options)``; all stop at teardown."""
    servers: list[DataServer] = []

    def make(options: dict | None = None, **kw) -> DataServer:
        s = start_server(options, **kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.shutdown(grace_s=2.0)


@pytest.fixture(scope="module")
def shared_server():
    """One server for the read-only tests of a module: 100 samples, batches of 8."""
    s = start_server()
    yield s
    s.shutdown(grace_s=2.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``hetero serve`` in its own process (so tests can kill -9 it)."""

    def __init__(self, options: list[str], port: int | None = None, workers: int = 1, token: str = TOKEN,
                 pipeline: str = "examples.synthetic:build_pipeline") -> None:
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "hetero", "serve", pipeline, "--host", "127.0.0.1",
                    "--port", str(self.port), "--workers", str(workers), "--token", token]
        for o in options:
            self.cmd += ["-o", o]
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True, timeout: float = 60.0) -> "ServerProcess":
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        from dnn_worker.control import ControlClient

        deadline = time.monotonic() + timeout
        with ControlClient(self.address, TOKEN) as ctl:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited {self.proc.returncode}: {self.proc.stdout.read()}")
                if ctl.healthy(timeout=1.0):
                    return
                time.sleep(0.2)
        raise TimeoutError(f"server {self.address} not healthy within {timeout}s")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def server_process():
    procs: list[ServerProcess] = []

    def make(options: list[str], **kw) -> ServerProcess:
        p = ServerProcess(options, **kw)
        procs.append(p)
        return p

    yield make
    for p in procs:
        p.kill()


@pytest.fixture
def fresh_forkserver():
    """For tests that run the trainer in this process with loader workers (started by a forkserver).

    A forkserver keeps the environment it started with, and its children inherit that, not this
    process's current one: one started by an earlier test (e.g. before SM_CHANNEL_TRAINING was set)
    would give this test's workers the wrong data. Stop it before and after the test.
    """
    from multiprocessing import forkserver

    forkserver._forkserver._stop()
    yield
    forkserver._forkserver._stop()


# ----------------------------------------------------------------- /dev/shm leak check
# Issue 8: shared-memory segments are always released, also after crashes and Ctrl-C.
# Slots are anonymous memfds, but multiprocessing's named semaphores (DataLoader
# queues, events) live in /dev/shm and leak if their owner and its resource
# tracker are killed together. The suite fails if it leaves any entry behind.
_SHM = Path("/dev/shm")


def _shm_entries() -> set[str]:
    try:
        return {p.name for p in _SHM.iterdir() if p.stat().st_uid == os.getuid()}
    except OSError:
        return set()


@pytest.fixture(scope="session", autouse=True)
def no_dev_shm_leak():
    before = _shm_entries()
    yield
    deadline = time.monotonic() + 10.0  # resource trackers unlink a moment after their owner dies
    while (leaked := _shm_entries() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    for name in leaked:  # leave the machine clean for the next run
        try:
            (_SHM / name).unlink()
        except OSError:
            pass
    if leaked:
        pytest.fail(f"the test run left {len(leaked)} entries in /dev/shm: {sorted(leaked)[:12]}", pytrace=False)


@pytest.fixture(autouse=True)
def _shm_attribution(request):
    """HETERO_SHM_TRACE=FILE: append which test left /dev/shm entries behind to FILE (debugging aid)."""
    trace = os.environ.get("HETERO_SHM_TRACE")
    if not trace:
        yield
        return
    before = _shm_entries()
    yield
    time.sleep(0.3)
    new = _shm_entries() - before
    if new:
        with open(trace, "a") as f:
            f.write(f"{request.node.nodeid}: {sorted(new)}\n")
