"""One data-plane measurement against the checkout on ``PYTHONPATH``; prints one JSON line.

Run by benchmarks/dataplane.py as a script (``python benchmarks/_dataplane_probe.py KIND JSON``)
with ``PYTHONPATH`` set to the checkout under test, so the same probe measures two checkouts
side by side. It uses only interfaces every checkout has: ``hetero serve``, ``RemoteDataset``,
``ControlClient`` and ``BulkConnection``.

Kinds:
    threads  {"connections": N}: server threads (and this process's threads) with N idle
             authenticated data-plane connections.
    stream   {"batch_bytes": B, "seconds": T, "shm": bool, "workers": W, "busy_us": U}: batches/s,
             GB/s, and CPU seconds / context switches per batch of the server process and this
             consumer. With U > 0 the consumer spends U microseconds of CPU after each batch (the
             CPU side of a training step), so batches wait for it; its CPU figure leaves that out.
"""
from __future__ import annotations

import inspect
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time

# benchmarks/common, found as the package ``common`` through the script's own folder (first on
# sys.path): ``benchmarks`` on PYTHONPATH is the checkout under test's, which may have none.
from common.proc import usage
from common.servers import blob_command, shutdown, start, wait_ready

TOKEN = "bench"


def _free_port() -> int:
    # hetero.ports is not in every checkout this runs against: the kernel picks the port.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(batch_bytes: int, workers: int, slots: int = 4) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = start(blob_command(port, batch_bytes, workers, TOKEN, slots))
    address = f"127.0.0.1:{port}"
    wait_ready(address, TOKEN)
    return proc, address


def _proc_stat(pid: int | None = None) -> tuple[float, int]:
    """(CPU seconds of the process, its threads' context switches), from /proc (default: this one)."""
    cpu, vol, invol = usage([os.getpid() if pid is None else pid])
    return cpu, vol + invol


def _threads(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _connection(address: str, port: int, shm: bool):
    from dnn_worker.transport.connection import BulkConnection

    if "events" in inspect.signature(BulkConnection).parameters:  # a checkout with receive threads
        return BulkConnection(address, "127.0.0.1", port, TOKEN, queue.Queue(), shared_memory=shm)
    return BulkConnection(address, "127.0.0.1", port, TOKEN, shared_memory=shm)


def threads(connections: int) -> dict:
    """Server threads, RSS and fds (and this process's threads) with ``connections`` idle connections."""
    from dnn_worker import ControlClient

    proc, address = _serve(1 << 16, 1)
    try:
        with ControlClient(address, TOKEN) as ctl:
            port = ctl.hello().bulk_port
        time.sleep(0.5)
        server_before, own_before = _threads(proc.pid), threading.active_count()
        rss_before, fds_before = _rss_kib(proc.pid), _fds(proc.pid)
        conns = [_connection(address, port, shm=False) for _ in range(connections)]
        for c in conns:
            c.open()
        time.sleep(1.0)
        server_after, own_after = _threads(proc.pid), threading.active_count()
        rss_after, fds_after = _rss_kib(proc.pid), _fds(proc.pid)
        for c in conns:
            c.close()
    finally:
        shutdown(proc, address, TOKEN)
    return {"connections": connections, "server_threads_idle": server_before, "server_threads": server_after,
            "consumer_threads_added": own_after - own_before, "server_rss_added_kib": rss_after - rss_before,
            "server_fds_added": fds_after - fds_before}


def _busy(us: float) -> float:
    """Spend ``us`` microseconds of this thread's CPU; returns the CPU seconds spent."""
    start = time.thread_time()
    end = start + us / 1e6
    now = start
    while now < end:
        now = time.thread_time()
    return now - start


def stream(batch_bytes: int, seconds: float, shm: bool, workers: int, busy_us: float = 0.0) -> dict:
    """Batches/s, GB/s, CPU and context switches per batch of the server and this consumer."""
    from dnn_worker import RemoteDataset

    proc, address = _serve(batch_bytes, workers)
    try:
        it = iter(RemoteDataset([address], TOKEN, seed=0, shared_memory=shm))
        for _ in range(20):  # warm-up: connection, slots, page faults
            next(it)
        s_cpu0, s_sw0 = _proc_stat(proc.pid)
        c_cpu0, c_sw0 = _proc_stat()
        n, nbytes, busy, start = 0, 0, 0.0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            nbytes += next(it)["blob"].numel()
            n += 1
            if busy_us:
                busy += _busy(busy_us)
        elapsed = time.perf_counter() - start
        s_cpu1, s_sw1 = _proc_stat(proc.pid)
        c_cpu1, c_sw1 = _proc_stat()
        del it
    finally:
        shutdown(proc, address, TOKEN)
    return {"batch_bytes": batch_bytes, "shm": shm, "batches": n, "seconds": elapsed,
            "batches_per_s": n / elapsed, "gbps": nbytes / elapsed / 1e9,
            "server_cpu_ms_per_batch": (s_cpu1 - s_cpu0) / n * 1e3,
            "consumer_cpu_ms_per_batch": (c_cpu1 - c_cpu0 - busy) / n * 1e3, "busy_us": busy_us,
            "server_switches_per_batch": (s_sw1 - s_sw0) / n,
            "consumer_switches_per_batch": (c_sw1 - c_sw0) / n}


def main() -> int:
    """Run the probe named on the command line with its JSON arguments; print its figures as one JSON line."""
    kind, args = sys.argv[1], json.loads(sys.argv[2])
    result = {"threads": threads, "stream": stream}[kind](**args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
