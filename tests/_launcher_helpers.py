"""Shared helpers of the launcher tests: emulated node trees and small, fast job settings."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from hetero.synthetic.mnist import write_synthetic
from hetero.local.tree import Node, build_nodes
from launcher.job.jobtoken import derive_token

# Small and fast on 2 cores: tiny batches, cheap augmentation, one loader/server worker.
FAST_HPS = {"pipeline.batch_size": 8, "pipeline.blur_kernel": 3, "data_workers": 1, "loader_workers": 1,
            "log_every": 100, "warmup_steps": 5}


def synth_data(path: Path, train: int = 1600, test: int = 400) -> Path:
    write_synthetic(path, train, test, seed=0)
    return path


# No torchvision import (seconds on 2 cores): for tests of the launcher, not of MNIST.
SYNTHETIC_HPS = {"pipeline": "examples.synthetic:build_pipeline", "pipeline.size": 400, "pipeline.batch_size": 8,
                 "data_workers": 1, "loader_workers": 1}


def nodes_for(tmp_path: Path, data_nodes: int = 1, dnn_nodes: int = 1, base: dict = FAST_HPS, **hps) -> list[Node]:
    data = synth_data(tmp_path / "data", 400, 0)
    return build_nodes(tmp_path / "nodes", data_nodes, dnn_nodes, False, data, {**base, **hps}, "test-job")


def token_of(node: Node) -> str:
    return derive_token(node.env["HETERO_JOB_SECRET"], node.env["TRAINING_JOB_NAME"])


def data_address(node: Node) -> str:
    return json.loads(node.env["HETERO_HOST_MAP"])[node.host]


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def wait_for_nodes(procs: dict[str, tuple[subprocess.Popen, object]], log_dir: Path, timeout_s: float) -> dict[str, str]:
    """Wait for every node process (``host -> (process, open log file)``) within one deadline,
    kill the process group of any still running, close the logs and return each host's log text."""
    deadline = time.monotonic() + timeout_s
    try:
        for proc, _ in procs.values():
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc, log in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            log.close()
    return {host: (log_dir / f"{host}.log").read_text() for host in procs}
