"""Shared fixtures: real data servers on free loopback ports, real worker processes."""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import pytest

from data_service.contract import tensor_layout
from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions
from hetero.testing import TOKEN, ServerProc

ROOT = Path(__file__).resolve().parent.parent

# An environment that sets PYTHONDONTWRITEBYTECODE makes every pytest-xdist worker rewrite every
# test module's asserts again, and every server and worker process compile the product again: the
# cached bytecode halves collection time.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def encode(batch) -> tuple[int, list, bytearray]:
    """A batch laid out as a data worker lays it out: (structure, tensor metas, payload)."""
    structure, metas, tensors, size = tensor_layout.plan_layout(batch)
    payload = bytearray(size)
    tensor_layout.write_payload(metas, tensors, payload)
    return structure, metas, payload


def pytest_collection_modifyitems(config, items):
    """Mark the long tier (tests/tiers.py): the slowest of the slow tests."""
    from tiers import LONG

    for item in items:
        nodeid = item.nodeid.removeprefix("tests/")
        if nodeid in LONG:
            if item.get_closest_marker("slow") is None:
                raise pytest.UsageError(f"{nodeid} is in tests/tiers.py's LONG but not marked slow: mark it slow")
            item.add_marker(pytest.mark.long)


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


@pytest.fixture
def server_process(tmp_path):
    """``server_process(pipeline_options, **ServerProc_kwargs)``: ``hetero serve`` in its own process
    (so tests can kill -9 it), building batch 0 at start-up and 4 slots per worker as the CLI's
    defaults; its output goes to a log under ``tmp_path``. All are killed at teardown."""
    procs: list[ServerProc] = []

    def make(options: dict, **kw) -> ServerProc:
        kw = {"probe": True, "slots": 4, "token": TOKEN, "log_path": tmp_path / f"server{len(procs)}.log", **kw}
        p = ServerProc(options, **kw)
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
# Shared-memory segments are always released, also after crashes and Ctrl-C.
# Slots are anonymous memfds, but multiprocessing's named semaphores (DataLoader
# queues, events) live in /dev/shm and leak if their owner and its resource
# tracker are killed together. The suite fails if it leaves any entry behind.
_SHM = Path("/dev/shm")


_SHM_BEFORE = pytest.StashKey[set]()
_NOT_OURS = {"libpod_lock"}  # podman's lock file: created by its first command, kept by design


def _shm_entries() -> set[str]:
    try:
        return {p.name for p in _SHM.iterdir() if p.stat().st_uid == os.getuid() and p.name not in _NOT_OURS}
    except OSError:
        return set()


def _controller(config) -> bool:
    """This process runs the whole session (no pytest-xdist, or xdist's controller, which ends last)."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session):
    if _controller(session.config):
        session.config.stash[_SHM_BEFORE] = _shm_entries()


def pytest_sessionfinish(session, exitstatus):
    # In the controller only: with xdist, one worker's end is not the run's (the others' live
    # entries are not leaks).
    if not _controller(session.config) or _SHM_BEFORE not in session.config.stash:
        return
    before = session.config.stash[_SHM_BEFORE]
    deadline = time.monotonic() + 10.0  # resource trackers unlink a moment after their owner dies
    while (leaked := _shm_entries() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    for name in leaked:  # leave the machine clean for the next run
        try:
            (_SHM / name).unlink()
        except OSError:
            pass
    if leaked:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_sep("!", f"the test run left {len(leaked)} entries in /dev/shm: {sorted(leaked)[:12]}",
                                red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
