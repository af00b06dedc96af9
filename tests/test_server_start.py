"""A data server's main process starts its workers before it imports torch (a second or more)."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import start_server
from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions

ROOT = Path(__file__).resolve().parents[1]


def test_hetero_serve_reaches_the_worker_spawn_without_importing_torch():
    code = ("import sys, hetero.cli; hetero.cli.build_parser(); import hetero.commands.serve; "
            "from data_service.contract.pipeline import PipelineSpec; import data_service.server.data_server, data_service.pool.worker_pool; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"imported before the workers start: {out.stdout.strip()}"


def test_the_workers_are_started_before_the_builder_module_is_imported(monkeypatch):
    seen = []
    server = DataServer(PipelineSpec("examples.synthetic:build_pipeline", {"size": 16, "batch_size": 4}), "t" * 32,
                        ServerOptions(host="127.0.0.1", port=0, bulk_port=0, num_workers=1, probe=False))
    real = PipelineSpec.server_side
    monkeypatch.setattr(PipelineSpec, "server_side", lambda self: (seen.append(len(server.pool.state.workers())),
                                                                   real(self))[1])
    server.start()
    try:
        assert seen == [1]
    finally:
        server.shutdown(grace_s=0.5)


@pytest.mark.parametrize("worker_start", ["warm", "spawn"])
def test_a_server_stopped_in_process_leaves_no_descriptor_open(worker_start):
    """A notebook or a test run starts and stops servers for days in one process: each stop closes
    its workers' pipes, process handles and regions, and the pool's wake pipe, while the caller
    still holds the stopped server."""
    def open_fds() -> list[str]:
        names = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                names.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # listdir's own descriptor, closed since
                pass
        return names

    # the first start's imports, and gRPC's poller, which lives while any of its servers does
    stopped = [start_server(num_workers=1, worker_start=worker_start)]
    stopped[0].shutdown(grace_s=2.0)
    gc.collect()
    before = open_fds()
    for _ in range(2):
        server = start_server(num_workers=1, worker_start=worker_start)
        server.shutdown(grace_s=2.0)
        stopped.append(server)
    gc.collect()
    # a start holds its worker's pipe, process handle and regions, and the wake pipe (6 descriptors or more):
    # 2 starts that left even one behind each would show 2
    after = open_fds()
    assert len(after) - len(before) < 2, sorted(set(after) - set(before))
