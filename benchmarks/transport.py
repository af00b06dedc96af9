"""Transport benchmark: delivered GB/s through the service vs a raw TCP socket pair.

    python -m benchmarks.transport [--sizes 1,4,16,32] [--seconds 3] [--json out.json]
    python -m benchmarks.transport --local-shm      # same-host shared memory vs memcpy
    python -m benchmarks.transport --baseline-root OTHER_CHECKOUT   # this checkout's service vs another's

Both paths run in the same run, sender and receiver in separate processes.
Default: raw TCP on loopback (sendall of a ready buffer / recv_into a
preallocated one) against the service over TCP (worker process builds the
batch into its shared slot -> server sends header + slot bytes -> RemoteDataset
receives into a pooled buffer and decodes tensors without copying).
``--local-shm``: the service's same-host path (the worker builds the batch in
its shared-memory slot; the consumer's tensors are views of that slot, leased
until it drops them) against a single-threaded memcpy of the same bytes: one buffer into
one (at a few MB both stay in the CPU cache), one into as many buffers as the worker has
slots (the working set of the worker's own copy), and rotating over 128 MB (cold).
``--baseline-root``: the service of this checkout and of another one, side by side in one run:
both measured by benchmarks/_dataplane_probe.py with ``PYTHONPATH`` at their checkout (server and
consumer each run that checkout's code), in turn, the order swapped every repeat; the table adds
the baseline's GB/s and this / baseline, the median of the ratios pair by pair, and their range.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path

from .common import cli, report, servers

MB = 1 << 20


def _raw_sender(port: int, size: int, seconds: float) -> None:
    buf = bytearray(os.urandom(1024)) * (size // 1024)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        end = time.monotonic() + seconds + 0.5
        view = memoryview(buf)
        while time.monotonic() < end:
            try:
                s.sendall(view)
            except OSError:
                return


def raw_tcp(size: int, seconds: float) -> float:
    """GB/s of a raw TCP socket pair, receiver into a preallocated buffer."""
    import torch

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    proc = mp.get_context("spawn").Process(target=_raw_sender, args=(lst.getsockname()[1], size, seconds))
    proc.start()
    conn, _ = lst.accept()
    buf = torch.empty(size, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    got = 0
    start = None
    end = time.monotonic() + seconds + 0.4
    while time.monotonic() < end:
        n = 0
        while n < size:
            k = conn.recv_into(view[n:], size - n)
            if not k:
                break
            n += k
        if start is None:  # first message is warm-up
            start, got = time.perf_counter(), 0
            continue
        got += n
    elapsed = time.perf_counter() - start
    conn.close()
    lst.close()
    proc.join(5)
    return got / elapsed / 1e9


def memcpy(size: int, seconds: float, cold: bool = False, destinations: int = 1) -> float:
    """GB/s of a single-threaded copy of ``size`` bytes into a preallocated buffer.

    ``cold``: rotate over enough source and destination buffers (>= 128 MB each side) that
    neither is in the CPU cache, as for batches a pipeline has just built; the plain figure
    copies one buffer into another again and again, which at a few MB runs from the cache.
    ``destinations``: one source copied into that many destinations in turn, as a worker
    writes into its slots in turn.
    """
    import numpy as np

    count = max(1, -(-(128 * MB) // size)) if cold else 1
    srcs = [np.frombuffer(os.urandom(1024) * (size // 1024), dtype=np.uint8) for _ in range(count)]
    dsts = [np.empty_like(srcs[0]) for _ in range(max(count, destinations))]
    for d in dsts:
        np.copyto(d, srcs[0])
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        np.copyto(dsts[n % len(dsts)], srcs[(n * 7 + 3) % count])
        n += 1
    return n * size / (time.perf_counter() - start) / 1e9


def service(size: int, seconds: float, workers: int, shm: bool = False, slots: int = 4) -> tuple[float, dict]:
    """GB/s delivered by the data service (``hetero serve`` in its own process) for ``size``-byte batches."""
    from dnn_worker import ControlClient, RemoteDataset
    from hetero.ports import free_port

    port = free_port()
    proc = servers.start(servers.blob_command(port, size, workers, "bench", slots))
    address = f"127.0.0.1:{port}"
    try:
        servers.wait_ready(address, "bench")
        it = iter(RemoteDataset([address], "bench", seed=0, shared_memory=shm))
        for _ in range(3):  # warm-up: connection, slots, page faults
            next(it)
        got, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            got += next(it)["blob"].numel()
        elapsed = time.perf_counter() - start
        with ControlClient(address, "bench") as ctl:
            stats = ctl.stats()
            ctl.shutdown(grace_s=1)
        del it
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    extra = {"worker_busy_fraction": round(stats.worker_busy_fraction, 3)}
    if shm:
        extra["zero_copy_share"] = round(stats.shm_leases / max(stats.batches_sent, 1), 3)
    return got / elapsed / 1e9, extra


def compared(size: int, args) -> tuple[dict, str]:
    """One batch size, this checkout's service against ``args.baseline_root``'s: the row and its line."""
    from .dataplane import probe  # dataplane imports this module's baselines: imported when used

    roots = {"this": Path(__file__).resolve().parent.parent, "baseline": Path(args.baseline_root).resolve()}
    raw, runs = [], {name: [] for name in roots}
    for i in range(args.repeats):  # interleaved, the order swapped each time, so drift hits all alike
        raw.append(memcpy(size, args.seconds) if args.local_shm else raw_tcp(size, args.seconds))
        for name in (("this", "baseline") if i % 2 == 0 else ("baseline", "this")):
            runs[name].append(probe(roots[name], "stream", batch_bytes=size, seconds=args.seconds,
                                    shm=args.local_shm, workers=args.workers)["gbps"])
    r, v, b = statistics.median(raw), statistics.median(runs["this"]), statistics.median(runs["baseline"])
    pairs = [t / o for t, o in zip(runs["this"], runs["baseline"])]
    ratio = statistics.median(pairs)
    row = {"batch_mb": size / MB, "baseline": "memcpy" if args.local_shm else "raw TCP", "baseline_gbps": round(r, 3),
           "service_gbps": round(v, 3), "ratio": round(v / r, 3), "old_service_gbps": round(b, 3),
           "old_ratio": round(b / r, 3), "new_over_old": round(ratio, 3),
           "new_over_old_runs": [round(x, 3) for x in pairs], "raw_runs": [round(x, 3) for x in raw],
           "service_runs": [round(x, 3) for x in runs["this"]], "old_service_runs": [round(x, 3) for x in runs["baseline"]]}
    line = (f"| {size / MB:g} | {r:.2f} | {v:.2f} | {b:.2f} | {v / r:.2f} | {b / r:.2f} | "
            f"**{ratio:.2f}** ({min(pairs):.2f}-{max(pairs):.2f}) |")
    return row, line


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--sizes", default="1,4,16,32", help="batch sizes in MB")
    cli.add_timing(parser)
    parser.add_argument("--workers", type=int, default=1, help="server worker processes")
    parser.add_argument("--slots", type=int, default=4, help="server slots per worker (--slots-per-worker; server default 4)")
    cli.add_json(parser)
    parser.add_argument("--local-shm", action="store_true", help="same-host shared memory vs memcpy")
    parser.add_argument("--baseline-root", default="", help="another checkout of this repository: its service "
                                                            "measured beside this one's")
    args = parser.parse_args(argv)
    if args.baseline_root and not (Path(args.baseline_root) / "benchmarks" / "_dataplane_probe.py").is_file():
        parser.error(f"--baseline-root {args.baseline_root!r} is not a checkout of this repository with "
                     "benchmarks/_dataplane_probe.py: pass the root of one (git worktree add DIR COMMIT)")
    sizes = [int(float(s) * MB) for s in args.sizes.split(",")]
    rows = []
    base_name = "memcpy" if args.local_shm else "raw TCP"
    path = "shared memory" if args.local_shm else "loopback TCP"
    print(f"transport benchmark: service over {path} vs {base_name}, {os.cpu_count()} cores, {args.repeats} runs x "
          f"{args.seconds}s per point, {args.workers} server worker(s) x {args.slots} slots", flush=True)
    cold_cols = (f" memcpy into {args.slots} slots GB/s | service / that | cold memcpy GB/s | service / cold memcpy |"
                 if args.local_shm else "")
    if args.baseline_root:
        print(f"this checkout against {Path(args.baseline_root).resolve()} (baseline)")
        print(f"| batch MB | {base_name} GB/s | service GB/s | baseline service GB/s | service / {base_name} | "
              f"baseline / {base_name} | service / baseline (range) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
    else:
        print(f"| batch MB | {base_name} GB/s | service GB/s | service / {base_name} |{cold_cols}")
        print("|---:|---:|---:|---:|" + ("---:|---:|---:|---:|" if args.local_shm else ""))
    for size in sizes:
        if args.baseline_root:
            row, line = compared(size, args)
            rows.append(row)
            print(line, flush=True)
            continue
        raw, svc, cold, slotted, extra = [], [], [], [], {}
        for _ in range(args.repeats):  # interleaved so drift hits both paths alike
            raw.append(memcpy(size, args.seconds) if args.local_shm else raw_tcp(size, args.seconds))
            if args.local_shm:
                slotted.append(memcpy(size, args.seconds, destinations=args.slots))
                cold.append(memcpy(size, args.seconds, cold=True))
            s, extra = service(size, args.seconds, args.workers, shm=args.local_shm, slots=args.slots)
            svc.append(s)
        r, v = statistics.median(raw), statistics.median(svc)
        row = {"batch_mb": size / MB, "baseline": base_name, "baseline_gbps": round(r, 3),
               "service_gbps": round(v, 3),
               "ratio": round(v / r, 3), "raw_runs": [round(x, 3) for x in raw],
               "service_runs": [round(x, 3) for x in svc], **extra}
        line = f"| {size / MB:g} | {r:.2f} | {v:.2f} | {v / r:.2f} |"
        if cold:
            m, c = statistics.median(slotted), statistics.median(cold)
            row.update(slots_memcpy_gbps=round(m, 3), ratio_to_slots=round(v / m, 3),
                       cold_memcpy_gbps=round(c, 3), ratio_to_cold=round(v / c, 3))
            line += f" {m:.2f} | {v / m:.2f} | {c:.2f} | {v / c:.2f} |"
        rows.append(row)
        print(line, flush=True)
    report.write_json(args.json, {"benchmark": "transport", "path": path, "cores": os.cpu_count(),
                                  "seconds": args.seconds, "repeats": args.repeats, "workers": args.workers,
                                  "slots": args.slots, "baseline_root": args.baseline_root, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
