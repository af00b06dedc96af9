"""Scale benchmark: S data servers x C consumer connections each, and a kill -9 of one server.

    python -m benchmarks.scale [--servers 2] [--layouts 1x4,2x8,8x8] [--seconds 15] [--batch-bytes 65536]

Each layout ``PxI`` runs P consumer processes with I iterators (threads) each; every iterator
is a ``Fetcher`` over all S servers, so each server has C = P x I connections. Consumers use
TCP (``shared_memory=False``), as consumers on other nodes do; the pipeline is the lightest
there is (one pre-made ``--batch-bytes`` tensor per batch), so the figures are about the data
plane. Reported per layout, over the measured window after a warm-up:

* aggregate batches/s, and the ratio to the first layout's;
* CPU per batch (utime + stime from /proc over the window; not in the kill run) of the server
  processes, of their workers, of the consumer processes, and of all of them, with the cores
  they kept busy: on a machine whose cores they share, a higher total per batch is what lowers
  batches/s;
* each server's share of the batches, and the least and mean batches per iterator (a starved
  consumer shows as min / mean far below 1);
* time per batch: each iterator's window divided by its batches, p50 and p99 over iterators; and
  the p99 of the time between two batches of one iterator (stalls);
* with ``--kill`` (on the last layout): one server is killed with SIGKILL halfway through the
  window; recovery is, per iterator, the end of its longest gap between two batches that
  spans the kill or starts within ``KILL_CAUSED_S`` after it, minus the kill time; the maximum
  over iterators is "every consumer delivering again". A kill -9 resets the server's
  connections at once (consumers drop it within about 0.1 s), so a gap that starts later is
  not waiting for the dead server's batches: the longest such gap is reported beside it
  ("later stall"), as a measure of the machine's jitter, not of recovery.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .common import cli, report, servers
from .common.proc import usage

TOKEN = "scale"
KILL_CAUSED_S = 1.0  # gaps starting this long after the kill are not waiting for the dead server
ROOT = Path(__file__).resolve().parent.parent


def start_server(batch_bytes: int, workers: int) -> tuple[subprocess.Popen, str]:
    """A blob server (:func:`benchmarks.common.servers.blob_command`) on a free port; it and its address."""
    from hetero.ports import free_port

    port = free_port()
    return servers.start(servers.blob_command(port, batch_bytes, workers, TOKEN), cwd=ROOT), f"127.0.0.1:{port}"


# ------------------------------------------------------------------ one consumer process

def _iterate(servers: list[str], seed: int, until: float, out: dict, count: int) -> None:
    from data_service.contract.batch_id import BatchId
    from dnn_worker.fetch.fetch_options import FetchOptions
    from dnn_worker.fetch.fetcher import Fetcher
    from dnn_worker.remote_dataset import SMALL_WINDOW

    refs = [BatchId(seed, 0, i) for i in range(count)]
    # The windows RemoteDataset would use with one-worker servers.
    fetcher = Fetcher(servers, refs, FetchOptions(TOKEN, small_window=SMALL_WINDOW, shared_memory=False,
                                                  connect_timeout=30, batch_timeout=30, client_id=f"scale-{seed}"))
    arrivals = out["arrivals"]
    try:
        for _ in fetcher:
            now = time.monotonic()
            arrivals.append(now)
            if now >= until:
                break
    except Exception as exc:  # reported, not raised: the other iterators' figures still count
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["per_server"] = fetcher.stats()


def consume(args: dict) -> int:
    import dnn_worker.fetch.fetcher  # noqa: F401  (imports torch: seconds, before the clock starts)

    print("ready", flush=True)
    go = sys.stdin.readline().split()  # "<start> <until>" on the shared monotonic clock
    if not go:
        return 1
    start, args["until"] = float(go[0]), float(go[1])
    time.sleep(max(0.0, start - time.monotonic()))
    outs = [{"arrivals": []} for _ in range(args["iterators"])]
    count = max(3000, 120_000 // args["total_iterators"])  # enough for the window; bounded memory
    threads = [threading.Thread(target=_iterate, args=(args["servers"], args["seed"] + k, args["until"], outs[k], count))
               for k in range(args["iterators"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args["until"] - time.monotonic() + 60)
    with open(args["out"], "w") as f:
        json.dump(outs, f)
    return 0


# ------------------------------------------------------------------ one layout

def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a server's workers and its resource tracker)."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _cpu_by_role(procs: list[subprocess.Popen], consumers: list[subprocess.Popen]) -> dict[str, tuple]:
    servers = [p.pid for p in procs]
    return {"server": usage(servers), "workers": usage([c for pid in servers for c in _children(pid)]),
            "consumers": usage([c.pid for c in consumers])}


def run_layout(servers: list[str], procs: list[subprocess.Popen], processes: int, iterators: int, seconds: float,
               warmup: float, kill: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        consumers = []
        for p in range(processes):
            args = {"servers": servers, "iterators": iterators, "seed": 1000 * p,
                    "total_iterators": processes * iterators,
                    "out": os.path.join(tmp, f"c{p}.json")}
            consumers.append(subprocess.Popen([sys.executable, "-m", "benchmarks.scale", "--consume", json.dumps(args)],
                                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for c in consumers:  # every process has imported torch and the product: start them together
            if c.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a consumer process exited before it was ready (code {c.wait(10)})")
        start = time.monotonic() + 1.0
        until = start + warmup + seconds
        for c in consumers:
            c.stdin.write(f"{start} {until}\n")
            c.stdin.flush()
        killed_at = None
        time.sleep(max(0.0, start + warmup - time.monotonic()))
        cpu0 = _cpu_by_role(procs, consumers)
        if kill:
            time.sleep(max(0.0, start + warmup + seconds / 2 - time.monotonic()))
            killed_at = time.monotonic()
            os.killpg(procs[0].pid, signal.SIGKILL)  # the server and its workers, like a node that vanishes
        else:
            time.sleep(max(0.0, until - time.monotonic()))
            cpu1 = _cpu_by_role(procs, consumers)
        for c in consumers:
            c.wait(seconds + warmup + 120)
        its = []
        for p in range(processes):
            with open(os.path.join(tmp, f"c{p}.json")) as f:
                its.extend(json.load(f))
    lo, hi = start + warmup, until
    counts = [sum(1 for t in it["arrivals"] if lo <= t < hi) for it in its]
    per_batch = sorted(seconds / n for n in counts if n)  # each iterator's mean time per batch
    gaps = [b - a for it in its for a, b in zip(it["arrivals"], it["arrivals"][1:]) if lo <= a < hi]
    per_server = {s: sum(it.get("per_server", {}).get(s, 0) for it in its) for s in servers}
    total = sum(per_server.values()) or 1
    mean = statistics.mean(counts) if counts else 0.0
    row = {"processes": processes, "iterators": iterators, "connections_per_server": processes * iterators,
           "batches_per_s": sum(counts) / seconds,
           "server_share": {s: round(n / total, 3) for s, n in per_server.items()},
           "min_per_iterator": min(counts) if counts else 0, "mean_per_iterator": round(mean, 1),
           "min_over_mean": round(min(counts) / mean, 3) if mean else 0.0,
           "p50_ms": round(1e3 * statistics.median(per_batch), 3) if per_batch else None,
           "p99_ms": round(1e3 * per_batch[min(len(per_batch) - 1, int(0.99 * len(per_batch)))], 3) if per_batch else None,
           "p99_gap_ms": round(1e3 * statistics.quantiles(gaps, n=100)[98], 3) if len(gaps) > 1 else None,
           "errors": [it["error"] for it in its if "error" in it]}
    if killed_at is None and sum(counts):
        used = {role: cpu1[role][0] - cpu0[role][0] for role in cpu0}
        for role, cpu in used.items():
            row[f"{role}_cpu_ms_per_batch"] = round(1e3 * cpu / sum(counts), 4)
            row[f"{role}_switches_per_batch"] = [round((cpu1[role][k] - cpu0[role][k]) / sum(counts), 3)
                                                 for k in (1, 2)]  # voluntary, involuntary
        row["total_cpu_ms_per_batch"] = round(1e3 * sum(used.values()) / sum(counts), 4)
        row["cores_busy"] = round(sum(used.values()) / seconds, 2)
    if killed_at is not None:
        recoveries = []
        for it in its:
            arr = it["arrivals"]
            worst, end = 0.0, 0.0
            for a, b in zip(arr, arr[1:]):
                if b > killed_at and a < killed_at + KILL_CAUSED_S and b - max(a, killed_at) > worst:
                    worst, end = b - max(a, killed_at), b - killed_at
            recoveries.append(end)
        later = [b - a for it in its for a, b in zip(it["arrivals"], it["arrivals"][1:])
                 if killed_at + KILL_CAUSED_S <= a < hi]
        row["recovery_s_each"] = sorted(round(r, 3) for r in recoveries)
        row["recovery_s_max"] = round(max(recoveries), 3)
        row["recovery_s_p50"] = round(statistics.median(recoveries), 3)
        row["later_stall_s_max"] = round(max(later), 3) if later else None
    return row


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--servers", type=int, default=2, help="data server processes")
    parser.add_argument("--workers", type=int, default=1, help="worker processes per server")
    parser.add_argument("--layouts", default="1x4,2x8,8x8",
                        help="consumer layouts PxI (P processes x I iterators), comma-separated")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window per layout")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before the window")
    parser.add_argument("--batch-bytes", type=int, default=1 << 16)
    parser.add_argument("--no-kill", action="store_true", help="skip the kill -9 run on the last layout")
    cli.add_json(parser)
    parser.add_argument("--consume", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.consume:
        return consume(json.loads(args.consume))
    try:
        layouts = [tuple(int(x) for x in part.lower().split("x")) for part in args.layouts.split(",")]
        if any(len(l) != 2 or min(l) < 1 for l in layouts):
            raise ValueError
    except ValueError:
        print(f"--layouts {args.layouts!r} must look like '1x4,8x8' (processes x iterators)", file=sys.stderr)
        return 2
    if args.servers < 1 or (args.servers < 2 and not args.no_kill):
        print(f"--servers {args.servers} must be >= 2 for the kill run (or pass --no-kill)", file=sys.stderr)
        return 2
    print(f"scale benchmark: {args.servers} servers x {args.workers} worker(s), {args.batch_bytes}-byte batches over "
          f"loopback TCP, {os.cpu_count()} cores, {args.seconds}s window after {args.warmup}s warm-up", flush=True)
    print("| consumers (P x I) | connections / server | batches/s | vs first | server shares | min / mean per "
          "iterator | time per batch p50 / p99 ms | gap p99 ms | CPU ms/batch: server / workers / consumers / all "
          "(cores busy) | recovery after kill -9 (max / p50 s; later stall, max s) |")
    print("|---|---:|---:|---:|---|---:|---|---:|---|---|")
    rows, first = [], None
    for n, (p, i) in enumerate(layouts):
        kill = not args.no_kill and n == len(layouts) - 1
        started = [start_server(args.batch_bytes, args.workers) for _ in range(args.servers)]
        try:
            for _, address in started:
                servers.wait_ready(address, TOKEN)
            row = run_layout([a for _, a in started], [proc for proc, _ in started], p, i, args.seconds,
                             args.warmup, kill)
        finally:
            servers.stop_all([proc for proc, _ in started], timeout=30, group=True)
        first = first or row["batches_per_s"]
        rows.append(row)
        shares = " / ".join(f"{v:.2f}" for v in row["server_share"].values())
        rec = (f"{row['recovery_s_max']:.2f} / {row['recovery_s_p50']:.2f}; {row['later_stall_s_max']}"
               if "recovery_s_max" in row else "-")
        cpu = (f"{row['server_cpu_ms_per_batch']:.3f} / {row['workers_cpu_ms_per_batch']:.3f} / "
               f"{row['consumers_cpu_ms_per_batch']:.3f} / {row['total_cpu_ms_per_batch']:.3f} ({row['cores_busy']})"
               if "total_cpu_ms_per_batch" in row else "-")
        print(f"| {p} x {i} | {row['connections_per_server']} | {row['batches_per_s']:.0f} | "
              f"{row['batches_per_s'] / first:.2f} | {shares} | {row['min_over_mean']:.2f} | {row['p50_ms']} / "
              f"{row['p99_ms']} | {row['p99_gap_ms']} | {cpu} | {rec} |", flush=True)
        if row["errors"]:
            print(f"  errors: {row['errors'][:3]}", flush=True)
    report.write_json(args.json, {"benchmark": "scale", "servers": args.servers, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
