"""Data-plane benchmark: this checkout against another one, side by side in one run.

    python -m benchmarks.dataplane --baseline-root /path/to/other/checkout [--seconds 4] [--repeats 3]

Each figure is measured for both checkouts in turn (interleaved, ``--repeats`` times, medians
reported) by benchmarks/_dataplane_probe.py, run with ``PYTHONPATH`` pointing at the checkout:

* threads in the server process with 1, 16 and 64 idle consumer connections (and the threads
  those connections add to the consumer);
* CPU per batch (server process + consumer process, from /proc) and context switches per
  batch, over loopback TCP at 64 KB and 4 MB, and through shared memory at 4 MB;
* the same CPU figures with a busy consumer (``--busy-us``): after each batch the consumer
  spends that much CPU (the CPU side of a training step), so batches wait for it instead of it
  waiting for them; its figure leaves the busy time out. This is the CPU a data plane takes
  from a training loop that is not starved;
* 64 KB batches/s to one consumer over TCP, beside raw TCP messages/s of the same size;
* shared memory at 4 MB in GB/s against a cold memcpy (benchmarks/transport.py's);
* the CPU floors under any data plane (benchmarks/floors.py): a raw TCP pair's CPU per 64 KB and
  4 MB message, and the CPU of one header-out, release-back round trip between two processes;
  each checkout's server + consumer CPU per batch is printed against them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from .common import cli, report
from .floors import raw_tcp_cpu, round_trip_cpu
from .transport import memcpy, raw_tcp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KB, MB = 1 << 10, 1 << 20
FIGURES = (("batches_per_s", "batches/s"), ("gbps", "GB/s"), ("server_cpu_ms_per_batch", "server CPU ms/batch"),
           ("consumer_cpu_ms_per_batch", "consumer CPU ms/batch"),
           ("server_switches_per_batch", "server context switches/batch"),
           ("consumer_switches_per_batch", "consumer context switches/batch"))


def probe(root: Path, kind: str, **args) -> dict:
    """Run one probe against the checkout at ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, str(HERE / "_dataplane_probe.py"), kind, json.dumps(args)], cwd=root,
                         env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"probe {kind} {args} on {root} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _cpu_per_batch(rows: list[dict]) -> float:
    """Server + consumer CPU ms per batch, each the median of ``rows``."""
    return _median(rows, "server_cpu_ms_per_batch") + _median(rows, "consumer_cpu_ms_per_batch")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The benchmark's command line."""
    parser = cli.parser(__doc__)
    parser.add_argument("--baseline-root", required=True, help="another checkout of this repository to compare with")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured time per streaming point")
    parser.add_argument("--repeats", type=int, default=3, help="runs per point and checkout; medians are reported")
    parser.add_argument("--workers", type=int, default=1, help="server worker processes")
    parser.add_argument("--busy-us", type=float, default=300.0,
                        help="CPU microseconds the busy consumer spends per batch (0: leave those points out)")
    cli.add_json(parser)
    return parser.parse_args(argv)


def threads(roots: dict[str, Path]) -> dict:
    """Server threads, RSS and fds with 1, 16 and 64 idle connections, per checkout; printed as they come."""
    print("\n| idle connections | server threads, baseline | this | consumer threads added, baseline | this "
          "| server RSS added KiB, baseline | this | server fds added, baseline | this |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    out = {}
    for n in (1, 16, 64):
        got = out[n] = {name: probe(root, "threads", connections=n) for name, root in roots.items()}
        print(f"| {n} | {got['baseline']['server_threads']} | {got['this']['server_threads']} | "
              f"{got['baseline']['consumer_threads_added']} | {got['this']['consumer_threads_added']} | "
              f"{got['baseline']['server_rss_added_kib']} | {got['this']['server_rss_added_kib']} | "
              f"{got['baseline']['server_fds_added']} | {got['this']['server_fds_added']} |", flush=True)
    return out


def points(busy_us: float) -> list[tuple[str, int, bool, float]]:
    """(label, batch bytes, shared memory, busy microseconds) of each streaming point."""
    out = [("64 KB TCP", 64 * KB, False, 0.0), ("4 MB TCP", 4 * MB, False, 0.0), ("4 MB shm", 4 * MB, True, 0.0)]
    if busy_us > 0:
        busy = f"busy consumer ({busy_us:g} us/batch)"
        out += [(f"64 KB TCP, {busy}", 64 * KB, False, busy_us), (f"4 MB TCP, {busy}", 4 * MB, False, busy_us),
                (f"4 MB shm, {busy}", 4 * MB, True, busy_us)]
    return out


def stream(roots: dict[str, Path], args: argparse.Namespace) -> tuple[dict, dict]:
    """Every streaming point's runs per checkout, and the references measured beside them: raw TCP
    messages/s at 64 KB, a cold memcpy at 4 MB."""
    runs_by_point, refs = {}, {}
    for label, size, shm, busy_us in points(args.busy_us):
        runs: dict[str, list[dict]] = {name: [] for name in roots}
        for _ in range(args.repeats):  # interleaved so drift hits both alike
            for name, root in roots.items():
                runs[name].append(probe(root, "stream", batch_bytes=size, seconds=args.seconds, shm=shm,
                                        workers=args.workers, busy_us=busy_us))
        runs_by_point[label] = runs
        if label == "64 KB TCP":
            refs["raw_tcp_msgs_per_s"] = statistics.median(
                raw_tcp(size, args.seconds) * 1e9 / size for _ in range(args.repeats))
        if shm and not busy_us:
            refs["cold_memcpy_gbps"] = statistics.median(memcpy(size, args.seconds, cold=True)
                                                         for _ in range(args.repeats))
    return runs_by_point, refs


def floor_cpu(seconds: float, repeats: int) -> dict[str, float]:
    """The CPU floor ms per batch under each unbusy point (benchmarks/floors.py), medians."""
    floors = {"64 KB TCP": [raw_tcp_cpu(64 * KB, seconds) for _ in range(repeats)],
              "4 MB TCP": [raw_tcp_cpu(4 * MB, seconds) for _ in range(repeats)],
              "4 MB shm": [round_trip_cpu(seconds) for _ in range(repeats)]}
    return {label: _median(rows, "total_ms") for label, rows in floors.items()}


def print_stream(stream_runs: dict) -> None:
    """Each streaming point's figures, baseline against this checkout."""
    print("\n| point | figure | baseline | this | this / baseline |")
    print("|---|---|---:|---:|---:|")
    for label, runs in stream_runs.items():
        for key, name in FIGURES:
            b, t = _median(runs["baseline"], key), _median(runs["this"], key)
            print(f"| {label} | {name} | {b:.3f} | {t:.3f} | {t / b if b else float('nan'):.2f} |")
        b, t = _cpu_per_batch(runs["baseline"]), _cpu_per_batch(runs["this"])
        print(f"| {label} | server + consumer CPU ms/batch | {b:.3f} | {t:.3f} | {t / b:.2f} |", flush=True)


def print_references(stream_runs: dict, refs: dict) -> None:
    """The service against raw TCP and a cold memcpy, and both checkouts against the CPU floors."""
    raw, cold = refs["raw_tcp_msgs_per_s"], refs["cold_memcpy_gbps"]
    r64, shm4 = stream_runs["64 KB TCP"], stream_runs["4 MB shm"]
    print(f"\nraw TCP, 64 KB messages: {raw:,.0f}/s; service / raw TCP: baseline "
          f"{_median(r64['baseline'], 'batches_per_s') / raw:.3f}, this {_median(r64['this'], 'batches_per_s') / raw:.3f}")
    print(f"cold memcpy, 4 MB: {cold:.2f} GB/s; shared memory / cold memcpy: baseline "
          f"{_median(shm4['baseline'], 'gbps') / cold:.2f}, this {_median(shm4['this'], 'gbps') / cold:.2f}")
    print("\n| point | CPU floor ms/batch (both ends) | baseline / floor | this / floor | half the baseline / floor |")
    print("|---|---:|---:|---:|---:|")
    for label, floor in refs["floor_cpu_ms"].items():
        b, t = (_cpu_per_batch(stream_runs[label][name]) for name in ("baseline", "this"))
        what = "raw TCP pair, same size" if "TCP" in label else "round trip, header out and release back"
        print(f"| {label} ({what}) | {floor:.3f} | {b / floor:.2f} | {t / floor:.2f} | {b / 2 / floor:.2f} |")


def main(argv: list[str] | None = None) -> int:
    """Measure both checkouts, print the tables; 2 when ``--baseline-root`` is not a checkout."""
    args = parse_args(argv)
    base = Path(args.baseline_root).resolve()
    # A checkout of either layout: the data server in one module, or in data_service/server/.
    if not any((base / "data_service" / p).is_file() for p in ("server.py", "server/data_server.py")):
        print(f"--baseline-root {str(base)!r} is not a checkout of this repository (no data_service/server.py "
              "or data_service/server/data_server.py)", file=sys.stderr)
        return 2
    roots = {"baseline": base, "this": ROOT}
    print(f"data-plane benchmark: {ROOT} (this) vs {base} (baseline), {os.cpu_count()} cores, "
          f"{args.repeats} runs x {args.seconds}s per point, {args.workers} server worker(s)", flush=True)
    results: dict = {"threads": threads(roots)}
    results["stream"], refs = stream(roots, args)
    refs["floor_cpu_ms"] = floor_cpu(args.seconds, args.repeats)
    results["references"] = refs
    print_stream(results["stream"])
    print_references(results["stream"], refs)
    report.write_json(args.json, results, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
