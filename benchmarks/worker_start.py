"""Data workers forked from the pool's warm parent against spawned: memory, start-up, replacement.

Each point runs in a fresh process holding one data server (synthetic pipeline) with N workers:
USS and RSS per worker and of the server's main process (psutil ``memory_full_info``), server start
to first batch (set beside a bare ``import torch`` and ``import torch, torchvision`` timed in
fresh interpreters in the same run), CPU seconds the workers (and the warm parent) spent
starting, and the time from killing a worker to its replacement being ready. The warm parent's
own memory is shown apart: it holds torch and the pipeline module once for all the workers it
forks; "all PSS" adds the proportional memory of the server, its workers and the warm parent:
what the group costs the node.

Each figure is the median of ``--repeats`` fresh runs, the points interleaved.

    python -m benchmarks.worker_start [--workers 1,2,4] [--repeats 3] [--json worker_start.json]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from benchmarks.common import cli, report
from benchmarks.common.proc import usage

MODES = ("spawn", "warm")
OPTS = {"size": 256, "batch_size": 8}
MB = 1 << 20


def _point(mode: str, workers: int) -> dict:
    """In a fresh process: one server, its memory, start-up and one replacement."""
    import psutil

    from data_service.contract.pipeline import PipelineSpec
    from data_service.protocol.generated import pb
    from data_service.server import DataServer, ServerOptions
    from dnn_worker.fetch.fetch_options import FetchOptions
    from dnn_worker.fetch.fetcher import Fetcher

    token = "b" * 32
    t0 = time.perf_counter()
    server = DataServer(PipelineSpec("examples.synthetic:build_pipeline", OPTS), token,
                        ServerOptions(num_workers=workers, probe=False, worker_start=mode)).start()
    try:
        fetcher = Fetcher([server.address], [pb.BatchRef(seed=1, epoch=0, index=0)],
                          FetchOptions(token, window=1, batch_timeout=60))
        next(iter(fetcher))
        first = time.perf_counter() - t0
        warm = [server.pool.launcher.parent.process.pid] if server.pool.launcher.parent else []
        start_cpu = usage(server.pool.worker_pids() + warm)[0]
        parent = psutil.Process(warm[0]).memory_full_info() if warm else None
        mem = [psutil.Process(p).memory_full_info() for p in server.pool.worker_pids()]
        main = psutil.Process().memory_full_info()
        victim = server.pool.worker_pids()[0]
        t1 = time.perf_counter()
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pids = server.pool.worker_pids()
            if len(pids) == workers and victim not in pids and server.pool.state.replacing == 0:
                break
            time.sleep(0.005)
        replace = time.perf_counter() - t1
        return {"mode": server.pool.launcher.method, "workers": workers, "first_batch_s": first,
                "start_cpu_s": start_cpu, "replace_s": replace,
                "worker_uss_mb": sum(m.uss for m in mem) / len(mem) / MB,
                "worker_rss_mb": sum(m.rss for m in mem) / len(mem) / MB,
                "main_uss_mb": main.uss / MB, "main_rss_mb": main.rss / MB,
                "parent_uss_mb": parent.uss / MB if parent else 0.0,
                "parent_rss_mb": parent.rss / MB if parent else 0.0,
                "total_pss_mb": (sum(m.pss for m in mem) + main.pss + (parent.pss if parent else 0)) / MB}
    finally:
        server.shutdown(grace_s=0.5)


def _bare_import(modules: str) -> float:
    code = f"import time; t = time.perf_counter(); import {modules}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return float(out.stdout.strip())


def _run_point(mode: str, workers: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.worker_start", "--point", mode, str(workers)],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"the {mode} point with {workers} workers failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, "python -m benchmarks.worker_start")
    p.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="fresh runs per point; medians are reported")
    p.add_argument("--point", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)  # one point, in a fresh process
    cli.add_json(p)
    args = p.parse_args(argv)
    if args.point:
        print(json.dumps(_point(args.point[0], int(args.point[1]))))
        return 0
    counts = [int(n) for n in args.workers.split(",")]
    bare = {m: report.medians([{"s": _bare_import(m)} for _ in range(args.repeats)])["s"]
            for m in ("torch", "torch, torchvision")}
    runs = {(n, mode): [] for n in counts for mode in MODES}
    for _ in range(args.repeats):  # interleaved, so that the machine's other load falls on both alike
        for n, mode in runs:
            runs[n, mode].append(_run_point(mode, n))
    rows = [{**r[0], **report.medians(r, [k for k in r[0] if k not in ("mode", "workers")])} for r in runs.values()]
    print(f"{report.command('python -m benchmarks.worker_start', argv)}  ({report.stamp()})")
    print("bare " + ", ".join(f"`import {m}`: {t:.2f} s" for m, t in bare.items()))
    print(f"{'workers':>7} {'start':>6} | {'worker USS':>10} {'RSS':>7} | {'main USS':>8} {'RSS':>7} MB | "
          f"{'parent USS':>10} {'RSS':>7} | {'all PSS':>7} MB | {'1st batch':>9} {'start CPU':>9} {'replace':>8} s")
    for r in rows:
        print(f"{r['workers']:>7} {r['mode']:>6} | {r['worker_uss_mb']:>10.1f} {r['worker_rss_mb']:>7.1f} | "
              f"{r['main_uss_mb']:>8.1f} {r['main_rss_mb']:>7.1f}    | {r['parent_uss_mb']:>10.1f} "
              f"{r['parent_rss_mb']:>7.1f} | {r['total_pss_mb']:>7.1f}    | {r['first_batch_s']:>9.2f} "
              f"{r['start_cpu_s']:>9.2f} {r['replace_s']:>8.3f}")
    report.write_json(args.json, {"date": report.stamp(), "bare_import_s": bare, "points": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
