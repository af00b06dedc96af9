"""The warm parent holds what the workers import, and nothing a fork must not copy.

What the first worker imported while building the pipeline is imported once, by the warm parent,
before it forks the others; what a worker imported building its first batch, for the workers
forked later. A forked worker holds no grpc, one thread and one socket (its pipe). A module
that leaves a thread, grpc or a socket in the warm parent is named, and nothing is forked after
it. A server started through the Python API in a user's script forks its workers too. A killed
worker's place goes to the spare, loaded before it died.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from _import_marks import VAR as MARKS, importers
from conftest import ROOT, TOKEN
from data_service.contract.batch_id import BatchId
from data_service.contract.pipeline import PipelineSpec
from data_service.pool.forked import WarmParent, WarmParentGone
from data_service.protocol.generated import pb
from data_service.server import DataServer, ServerOptions
from dnn_worker.fetch.fetch_options import FetchOptions
from dnn_worker.fetch.fetcher import Fetcher

pytestmark = pytest.mark.timeout(240)
FACTS = "_facts_pipeline:build_pipeline"


def _server(target: str, opts: dict, workers: int) -> DataServer:
    return DataServer(PipelineSpec(target, opts), TOKEN, ServerOptions(num_workers=workers, probe=False)).start()


def _batches(server: DataServer, epoch: int, count: int) -> list[dict]:
    refs = [BatchId(1, epoch, i) for i in range(count)]
    return [b for _, b in Fetcher([server.address], refs, FetchOptions(TOKEN, window=2, batch_timeout=60))]


def _wait(what, timeout: float, message: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(message)


def test_the_warm_parent_imports_what_the_first_worker_did_and_forks_workers_without_grpc_threads_or_sockets(
        tmp_path, monkeypatch):
    monkeypatch.setenv(MARKS, str(tmp_path))
    server = _server(FACTS, {"batch_size": 4}, workers=3)
    try:
        parent = server.pool.starter.parent.pid
        workers = server.pool.worker_pids()
        # Built by the first worker, then imported once by the warm parent before it forked the others.
        built = importers(tmp_path, "_marked_at_build")
        assert len(built) == 2 and built[1] == parent and built[0] in workers, (built, parent, workers)
        facts = _batches(server, 0, 12)
        pids = {int(p) for b in facts for p in b["pid"]}
        assert pids <= set(workers) and len(pids) > 1, (pids, workers)
        assert all(int(b["grpc"].max()) == 0 for b in facts), "a data worker loaded grpc"
        assert all(int(b["threads"].max()) == 1 for b in facts), [b["threads"] for b in facts]
        assert all(int(b["sockets"].max()) == 1 for b in facts), "a worker holds a socket besides its pipe"
        # What building a first batch imported reaches the warm parent too, for the workers forked later.
        _wait(lambda: parent in importers(tmp_path, "_marked_at_first_batch"), 60,
              f"the warm parent did not import what the first batch did: {importers(tmp_path, '_marked_at_first_batch')}")
        warm = psutil.Process(parent)
        assert warm.num_threads() == 1
        with open(f"/proc/{parent}/maps") as f:
            assert "cygrpc" not in f.read()
    finally:
        server.shutdown(grace_s=0.5)


@pytest.mark.parametrize("module, hazard", [("_thread_at_import", "thread"), ("_socket_at_import", "socket"),
                                            ("_grpc_pipeline", "grpc")])
def test_a_module_that_leaves_a_hazard_in_the_warm_parent_is_named_and_nothing_is_forked_after_it(module, hazard):
    parent = WarmParent(PipelineSpec(f"{module}:build_pipeline").to_json(), base=())  # no torch: quicker
    try:
        report = parent.ready(120)
        assert report is not None and report["error"] is None
        assert f"importing {module!r} (the pipeline's module)" in report["unsafe"] and hazard in report["unsafe"]
        assert parent.process.wait(30) == 0, "it serves no fork after a hazard: it exits"
        with pytest.raises(WarmParentGone):
            parent.fork(print, (), "hetero-data-worker-0")
    finally:
        parent.close(5)


@pytest.mark.slow
def test_a_pipeline_module_that_loads_grpc_falls_back_to_spawn_naming_that_module(caplog):
    caplog.set_level(logging.WARNING, logger="data_service.pool.warm_start")
    server = _server("_grpc_pipeline:build_pipeline", {"size": 16, "batch_size": 4}, workers=1)
    try:
        assert server.pool.starter.method == "spawn"
        said = [r.getMessage() for r in caplog.records if "spawn" in r.getMessage()]
        assert said and "importing '_grpc_pipeline' (the pipeline's module) loaded grpc" in said[0], said
    finally:
        server.shutdown(grace_s=0.5)


def test_what_a_worker_imported_beside_a_thread_it_started_is_not_imported_by_the_warm_parent(tmp_path, monkeypatch):
    monkeypatch.setenv(MARKS, str(tmp_path))
    server = _server(FACTS, {"batch_size": 4, "thread": True}, workers=2)
    try:
        parent = server.pool.starter.parent.pid
        assert server.pool.starter.method == "warm"
        assert {psutil.Process(p).ppid() for p in server.pool.worker_pids()} == {parent}
        assert psutil.Process(parent).num_threads() == 1
        assert parent not in importers(tmp_path, "_marked_at_build")  # each worker imported it for itself
        assert len(importers(tmp_path, "_marked_at_build")) >= 2
    finally:
        server.shutdown(grace_s=0.5)


USER_SCRIPT = """
import json
import sys

import dnn_worker  # loads grpc at the top of the script, as a training script does
from data_service import DataServer, PipelineSpec, ServerOptions

if __name__ == "__main__":
    import psutil

    server = DataServer(PipelineSpec("examples.synthetic:build_pipeline", {"size": 16}), "t" * 32,
                        ServerOptions(num_workers=2, probe=False)).start()
    try:
        parents = {psutil.Process(pid).ppid() for pid in server.pool.worker_pids()}
        warm = server.pool.starter.parent
        print(json.dumps({"method": server.pool.starter.method,
                          "forked": warm is not None and parents == {warm.pid}}))
    finally:
        server.shutdown(grace_s=0.5)
"""


@pytest.mark.slow
def test_a_server_started_through_the_python_api_in_a_users_script_forks_its_workers(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=200,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"method": "warm", "forked": True}, out.stderr[-3000:]


def test_a_killed_worker_is_replaced_by_the_spare_and_a_new_spare_is_loaded():
    server = _server("examples.synthetic:build_pipeline", {"size": 32, "batch_size": 4}, workers=1)
    try:
        starter = server.pool.starter
        spare = _wait(lambda: starter.spare_pid, 60, "no spare worker was loaded")
        assert psutil.Process(spare).name() == "hetero-spare" and spare not in server.pool.worker_pids()
        victim = server.pool.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: server.pool.worker_pids() == [spare], 30, f"the spare {spare} did not replace {victim}")
        assert psutil.Process(spare).name() != "hetero-spare"  # it took a worker's name back
        assert len(_batches(server, 0, 8)) == 8
        _wait(lambda: starter.spare_pid not in (None, spare), 60, "no new spare after the first was taken")
    finally:
        server.shutdown(grace_s=0.5)


def test_the_import_recorder_names_what_was_imported_since_in_order_less_what_failed(tmp_path, monkeypatch):
    from data_service.pool.preload import ImportRecorder

    pkg = tmp_path / "recorded_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "first.py").write_text("from . import second\ntry:\n    import recorded_missing\nexcept ImportError:\n    pass\n")
    (pkg / "second.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    recorder = ImportRecorder()
    try:
        import recorded_pkg.first  # noqa: F401
        import json  # noqa: F401  (imported before: not new)

        assert recorder.take() == ("recorded_pkg", "recorded_pkg.first", "recorded_pkg.second")
        assert recorder.take() == ()
    finally:
        recorder.remove()
        for name in ("recorded_pkg", "recorded_pkg.first", "recorded_pkg.second"):
            sys.modules.pop(name, None)
    assert recorder not in sys.meta_path


@pytest.mark.parametrize("options, wanted, unwanted", [
    ({}, {"torchvision.io", "torchvision.transforms.v2"}, {"pyarrow.parquet", "boto3", "data_service.shards"}),
    ({"shards": "/data/shards"}, {"torchvision.io", "data_service.shards"}, {"pyarrow.parquet", "boto3"}),
    ({"parquet": "s3://bucket/train"}, {"data_service.shards.parquet", "pyarrow.parquet", "boto3"}, set()),
])
def test_the_image_pipeline_declares_what_its_workers_import_for_its_options(options, wanted, unwanted):
    import data_service.pipelines.images  # noqa: F401  (the warm parent imports the module first)
    from data_service.pool.preload import declared

    module, names, error = declared(PipelineSpec("data_service.pipelines.images:build_pipeline", options).to_json())
    assert module == "data_service.pipelines.images" and error is None
    assert wanted <= set(names) and not unwanted & set(names), names


@pytest.mark.slow
def test_hetero_serve_starts_its_warm_parent_first_and_the_pool_adopts_that_one(tmp_path):
    from hetero.testing import ServerProc

    server = ServerProc({"size": 16, "batch_size": 4}, workers=2, token=TOKEN, log_path=tmp_path / "server.log").start()
    try:
        warm = [c for c in psutil.Process(server.pid).children() if c.name() == "hetero-warm"]
        assert len(warm) == 1, [(c.pid, c.name()) for c in psutil.Process(server.pid).children()]
        assert {psutil.Process(p).ppid() for p in server.worker_pids()} == {warm[0].pid}
        assert len(server.worker_pids()) == 2
    finally:
        server.stop()


def test_spare_worker_must_be_a_bool_and_the_error_names_the_value():
    from data_service.errors import ConfigError

    with pytest.raises(ConfigError, match=r"spare_worker='no' must be True or False"):
        ServerOptions(spare_worker="no")


def test_the_image_pipelines_warm_parent_holds_torchvision_and_pil_for_every_worker(tmp_path):
    from hetero.synthetic.images import write_image_folder

    write_image_folder(tmp_path, per_class=4, classes=2, seed=1, min_side=64, max_side=96)
    server = _server("data_service.pipelines.images:build_pipeline",
                     {"data_dir": str(tmp_path), "batch_size": 4, "image_size": 32}, workers=2)
    try:
        parent = server.pool.starter.parent.pid
        with open(f"/proc/{parent}/maps") as f:
            maps = f.read()
        assert "torchvision/image.so" in maps and "PIL/_imaging" in maps, "imported by each worker instead"
        assert "cygrpc" not in maps
        assert {psutil.Process(p).ppid() for p in server.pool.worker_pids()} == {parent}
        assert len(_batches(server, 0, 2)) == 2
    finally:
        server.shutdown(grace_s=0.5)
