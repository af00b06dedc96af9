"""The `hetero` command line: serve, stats, shutdown, and start-up errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, TOKEN


def hetero(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "hetero", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.slow
def test_serve_stats_and_authenticated_shutdown(server_process):
    server = server_process({"size": 40, "batch_size": 8}).start()
    stats = hetero("stats", server.address, "--token", TOKEN)
    assert stats.returncode == 0 and json.loads(stats.stdout)["workers"] == 1
    denied = hetero("shutdown", server.address, "--token", "wrong")
    assert denied.returncode == 1 and "refused the job token" in denied.stderr
    assert server.proc.poll() is None  # still serving
    ok = hetero("shutdown", server.address, env={"HETERO_JOB_TOKEN": TOKEN})
    assert ok.returncode == 0 and "shutting down" in ok.stdout
    assert server.proc.wait(30) == 0


@pytest.mark.slow
def test_serve_reports_bad_pipeline_before_serving():
    out = hetero("serve", "nowhere.at_all:build", "--port", "0", "--token", "t")
    assert out.returncode == 2 and "cannot import module 'nowhere.at_all'" in out.stderr
    out = hetero("serve", "examples.synthetic:build_pipeline", "-o", "batch_size=0", "--port", "0", "--token", "t")
    assert out.returncode == 2 and "batch_size=0" in out.stderr


def test_serve_needs_a_token():
    env = {k: v for k, v in os.environ.items() if k != "HETERO_JOB_TOKEN"}
    out = subprocess.run([sys.executable, "-m", "hetero", "serve", "examples.synthetic:build_pipeline", "--port", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, env={**env, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and "HETERO_JOB_TOKEN" in out.stderr
