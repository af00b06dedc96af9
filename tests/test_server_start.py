"""A data server's main process starts its workers before it imports torch (a second or more)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
