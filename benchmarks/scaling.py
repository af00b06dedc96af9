"""Scaling benchmark: delivered batches/s vs worker processes spread over data servers.

    python -m benchmarks.scaling [--workers 1,2,4] [--servers 1,2,3] [--seconds 8] [--json out.json]

A CPU-heavy synthetic pipeline (busy-loop augmentation, ``--work-ms`` per sample)
is served by S servers (separate ``hetero serve`` processes) with W workers in all,
and one consumer (``RemoteDataset``) pulls from all of them. Efficiency is
throughput / (W x the one-worker throughput measured in the same run). Points
with more workers than cores are printed but say so: they cannot scale.
``--images DIR`` serves the JPEG image-folder pipeline (``data_service.pipelines.images``: decode,
RandomResizedCrop(224), flip) on DIR instead, epoch after epoch.
"""
from __future__ import annotations

import os
import sys
import time

from dnn_worker import RemoteDataset
from hetero.ports import free_port

from .common import cli, report
from .common.consume import epochs
from .common.servers import serve_command, start, stop_all, wait_ready

TOKEN = "scaling-bench"


def measure(workers: int, servers: int, seconds: float, work_ms: float, batch_size: int,
            images: str | None = None) -> float:
    """Batches/s delivered to one consumer by ``workers`` workers over ``servers`` servers."""
    split = [workers // servers + (1 if i < workers % servers else 0) for i in range(servers)]
    pipeline = (["data_service.pipelines.images:build_pipeline", "-o", f"data_dir={images}"] if images else
                ["examples.synthetic:build_pipeline", "-o", "size=100000", "-o", f"work_ms={work_ms}",
                 "-o", "shape=[1,28,28]"])
    procs, addresses = [], []
    try:
        for n in split:
            port = free_port()
            procs.append(start(serve_command([*pipeline, "-o", f"batch_size={batch_size}"], port, n, TOKEN)))
            addresses.append(f"127.0.0.1:{port}")
        for a in addresses:
            wait_ready(a, TOKEN)
        it = epochs(RemoteDataset(addresses, TOKEN, seed=0))
        for _ in range(2 * workers):  # warm-up: every worker busy, queues full
            next(it)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            next(it)
            n += 1
        return n / (time.perf_counter() - t0)
    finally:
        stop_all(procs, timeout=20)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--workers", default=None, help="total worker counts (default 1,2,4.. up to the cores)")
    parser.add_argument("--servers", default="1,2,3", help="server counts to spread the workers over")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--work-ms", type=float, default=4.0, help="busy CPU ms per sample")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--images", default=None, metavar="DIR",
                        help="serve the JPEG image-folder pipeline on DIR (root/<class>/*.jpg) instead")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    if args.workers:
        counts = [int(x) for x in args.workers.split(",")]
    else:
        counts, w = [], 1
        while w <= cores:
            counts.append(w)
            w *= 2
    server_counts = [int(x) for x in args.servers.split(",")]
    work = f"JPEG image folder {args.images}" if args.images else f"{args.work_ms} ms/sample"
    print(f"scaling benchmark: {cores} cores, {work} x {args.batch_size} samples per batch, {args.seconds}s per point")
    base = measure(1, 1, args.seconds, args.work_ms, args.batch_size, args.images)
    rows = [{"workers": 1, "servers": 1, "batches_per_s": round(base, 2), "efficiency": 1.0}]
    print("| workers | servers | batches/s | efficiency vs 1 worker |\n|---:|---:|---:|---:|")
    print(f"| 1 | 1 | {base:.2f} | 1.00 |", flush=True)
    for w in counts:
        for s in server_counts:
            if s > w or (w, s) == (1, 1):
                continue
            rate = measure(w, s, args.seconds, args.work_ms, args.batch_size, args.images)
            eff = rate / (w * base)
            note = " (more workers than cores)" if w > cores else ""
            rows.append({"workers": w, "servers": s, "batches_per_s": round(rate, 2), "efficiency": round(eff, 3)})
            print(f"| {w} | {s} | {rate:.2f} | {eff:.2f}{note} |", flush=True)
    report.write_json(args.json, {"benchmark": "scaling", "cores": cores, "work_ms": args.work_ms,
                                  "images": args.images, "batch_size": args.batch_size, "seconds": args.seconds,
                                  "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
