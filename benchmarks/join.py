"""Join latency: from starting a ``hetero serve --join`` process to a batch from it on every rank.

    python -m benchmarks.join [--ranks 4] [--runs 3] [--workers 1] [--step-s 0.02]

One data server (``hetero serve --join``) is registered in a folder registry; ``--ranks`` consumer
processes read epochs of ``examples.synthetic`` from ``RemoteDataset(None, token, registry=...)``
with a pause of ``--step-s`` per batch (an emulated training step). Each run then starts a second
server process with ``--join`` and measures, on the wall clock:

* start -> registered: the process start until its registry entry is written, in two parts:
  start -> server object (the entry's ``started_at``: the interpreter and its imports, torch among
  them) and server object -> registered (the pipeline loaded, its worker processes started: each
  a new interpreter importing torch and the pipeline; the ports opened);
* registered -> every rank: from the entry to the last rank's first batch from the new server
  (the consumers' registry poll, about 1 s, the connection, the first batch);
* join latency: start -> every rank, the figure the goal (under 5 s) is about.

Each run then drains the new server with ``hetero shutdown --drain`` and reports how long it
took to leave. Figures are the median of ``--runs`` runs (and the worst run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common.servers import serve_command

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "join-benchmark-token"
PIPELINE = "examples.synthetic:build_pipeline"
OPTIONS = {"size": 4096, "batch_size": 8}


def consumer_main(args: argparse.Namespace) -> None:
    """One rank: read epochs until ``stop`` exists; write the wall time of the first batch from
    each server to ``firsts-rank<R>.json`` as soon as it comes."""
    from dnn_worker import RemoteDataset

    out = Path(args.out)
    ds = RemoteDataset(None, TOKEN, registry=args.registry, seed=0, rank=args.rank, world_size=args.world,
                       connect_timeout=60)
    firsts: dict[str, float] = {}
    epoch = 0
    while not (out / "stop").exists():
        ds.set_epoch(epoch)
        for _ in ds:
            time.sleep(args.step_s)
            seen = {a: n for a, n in ds.fetcher.stats().items() if n > 0 and a not in firsts}
            if seen:
                now = time.time()
                firsts.update({a: now for a in seen})
                tmp = out / f".firsts-rank{args.rank}.tmp"
                tmp.write_text(json.dumps(firsts))
                os.replace(tmp, out / f"firsts-rank{args.rank}.json")
            if (out / "stop").exists():
                break
        epoch += 1


def serve_cmd(registry: str, port: int, workers: int) -> list[str]:
    """``hetero serve --join REGISTRY`` of the benchmark's pipeline on ``port``."""
    pipeline = [PIPELINE, *[a for k, v in OPTIONS.items() for a in ("-o", f"{k}={json.dumps(v)}")]]
    return serve_command(pipeline, port, workers, TOKEN, "--join", registry, "--advertise-host", "127.0.0.1",
                         "--no-probe")


def firsts(out: Path, ranks: int) -> list[dict[str, float]]:
    found = []
    for r in range(ranks):
        try:
            found.append(json.loads((out / f"firsts-rank{r}.json").read_text()))
        except (OSError, json.JSONDecodeError):
            found.append({})
    return found


def one_run(registry: str, out: Path, ranks: int, workers: int, env: dict) -> dict[str, float]:
    from data_service.membership.registry import read_entries
    from hetero.commands.shutdown import wait_gone
    from hetero.ports import free_port
    from dnn_worker.transport.control import ControlClient

    port = free_port()
    address = f"127.0.0.1:{port}"
    start = time.time()
    proc = subprocess.Popen(serve_cmd(registry, port, workers), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    registered = made = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if registered is None:
            mine = [e for e in read_entries(registry)[0] if e.address == address]
            if mine:
                registered = (Path(registry) / "servers" / f"{mine[0].server_id}.json").stat().st_mtime
                made = mine[0].started_at
        got = [f.get(address) for f in firsts(out, ranks)]
        if all(got):
            break
        if proc.poll() is not None:
            raise RuntimeError(f"the joining server exited with {proc.returncode}")
        time.sleep(0.02)
    else:
        proc.kill()
        raise RuntimeError(f"not every rank had a batch from {address} within 60 s: {got}")
    every = max(got)
    drain_start = time.monotonic()
    with ControlClient(address, TOKEN, "benchmark") as ctl:
        ctl.shutdown(grace_s=30.0, reason="hetero shutdown --drain")
    left = wait_gone(address, TOKEN, 60.0)
    proc.wait(30)
    return {"start_to_registered_s": registered - start, "  of which imports_s": made - start,
            "  of which server_start_s": registered - made, "registered_to_every_rank_s": every - registered,
            "join_latency_s": every - start, "first_rank_s": min(got) - start,
            "drain_s": left if left is not None else time.monotonic() - drain_start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="worker processes of each server")
    ap.add_argument("--step-s", type=float, default=0.02, help="each rank's pause per batch (an emulated step)")
    ap.add_argument("--consumer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--registry", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.consumer:
        consumer_main(args)
        return
    from hetero.ports import free_port

    work = Path(tempfile.mkdtemp(prefix="join-bench-"))
    registry = work / "registry"
    registry.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    base = subprocess.Popen(serve_cmd(str(registry), free_port(), args.workers), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    consumers = [subprocess.Popen([sys.executable, "-m", "benchmarks.join", "--consumer", "--registry", str(registry),
                                   "--out", str(work), "--rank", str(r), "--world", str(args.ranks),
                                   "--step-s", str(args.step_s)], cwd=ROOT, env=env)
                 for r in range(args.ranks)]
    results = []
    try:
        deadline = time.monotonic() + 120
        while sum(1 for f in firsts(work, args.ranks) if f) < args.ranks and time.monotonic() < deadline:
            time.sleep(0.1)  # every rank reads from the first server
        time.sleep(2.0)
        for i in range(args.runs):
            r = one_run(str(registry), work, args.ranks, args.workers, env)
            results.append(r)
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()), flush=True)
            time.sleep(1.0)
    finally:
        (work / "stop").touch()
        for c in consumers:
            try:
                c.wait(30)
            except subprocess.TimeoutExpired:
                c.kill()
        base.terminate()
        base.wait(30)
    print(f"\njoin latency with {args.ranks} ranks, {args.workers} worker(s) per server, median of {len(results)} "
          f"runs (worst):")
    for key in results[0]:
        values = [r[key] for r in results]
        print(f"  {key:28s} {statistics.median(values):6.2f} s  ({max(values):.2f})")
    goal = statistics.median(r["join_latency_s"] for r in results)
    print(f"goal: every rank uses a new server within 5 s of its start: {'met' if goal < 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
