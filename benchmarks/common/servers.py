"""``hetero serve`` processes a benchmark starts for a measurement: their command, their start,
readiness, and their end.

Only the standard library is imported at the top: ``benchmarks/_dataplane_probe.py`` runs these
under another checkout's ``PYTHONPATH``, and the server is whatever ``python -m hetero`` is there.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

MB = 1 << 20
BLOB_PIPELINE = "examples.synthetic:build_blob_pipeline"


def serve_command(pipeline: list[str], port: int, workers: int, token: str, *options: str) -> list[str]:
    """``hetero serve`` of ``pipeline`` (its import path and ``-o`` options) on 127.0.0.1:``port``
    with ``workers`` worker processes; ``options``: further ``hetero serve`` options."""
    return [sys.executable, "-m", "hetero", "--log-level", "WARNING", "serve", *pipeline, "--host", "127.0.0.1",
            "--port", str(port), "--workers", str(workers), *options, "--token", token]


def blob_command(port: int, batch_bytes: int, workers: int, token: str, slots: int | None = None) -> list[str]:
    """A server whose batches are one pre-made ``batch_bytes`` tensor: the lightest pipeline there
    is, so what is measured is the data plane. ``slots``: built batches per worker (None: the server's default)."""
    pipeline = [BLOB_PIPELINE, "-o", "size=1000000", "-o", f"batch_bytes={batch_bytes}"]
    slot_options = ["--slots-per-worker", str(slots)] if slots else []
    return serve_command(pipeline, port, workers, token, *slot_options,
                         "--max-batch-bytes", str(max(2 * batch_bytes, MB)))


def start(cmd: list[str], cwd: str | os.PathLike | None = None) -> subprocess.Popen:
    """Start ``cmd`` with its output dropped, in a session of its own, so that a signal to its
    process group reaches its workers too."""
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def wait_ready(address: str, token: str, timeout: float = 120.0) -> None:
    """Return once the server at ``address`` answers its control port."""
    from dnn_worker import ControlClient

    with ControlClient(address, token) as ctl:
        ctl.wait_hello(timeout)


def shutdown(proc: subprocess.Popen, address: str, token: str) -> None:
    """Ask the server to shut down; kill it where it does not, or cannot be asked."""
    from dnn_worker import ControlClient

    try:
        with ControlClient(address, token) as ctl:
            ctl.shutdown(grace_s=1)
        proc.wait(30)
    except Exception:
        pass  # a server that does not answer is killed below
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def stop_all(procs: list[subprocess.Popen], timeout: float = 30.0, group: bool = False) -> None:
    """SIGTERM every process still running, then SIGKILL each one not gone within ``timeout``;
    ``group``: signal each one's whole process group (a server and its workers)."""
    def send(proc: subprocess.Popen, sig: int) -> None:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)

    for proc in procs:
        if proc.poll() is None:
            send(proc, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            send(proc, signal.SIGKILL)
