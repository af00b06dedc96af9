"""Data workers as users meet them: memory while batches stream, a killed worker's gap, start-up.

Each point is ``hetero serve`` of one pipeline with N workers, started from a checkout (``--trees``:
old and new side by side, the points alternated), and a consumer in this process streaming its
batches as fast as they come. It reports:

* start to first batch: from starting ``hetero serve`` to the consumer holding batch 0 (the server
  builds its probe batch first, as by default), against a bare ``python -c "import torch,
  torchvision"`` timed the same way in the same run;
* after the stream has run ``--stream-s`` seconds: each worker's USS and its own memory (its USS
  with its output slots whole: the server and the consumer map those too, which takes them out
  of its USS), the warm parent's, the spare's and the main process's USS, and the PSS of them
  all; one more worker's memory is its own memory, and beside it the PSS of the N=2 point less
  that of the N=1 point (separate runs: a few MB of noise);
* the workers' CPU seconds per batch over the stream (after its first seconds); and the CPU seconds
  the spare worker spent loading (once, not per batch);
* with one worker: the longest gap between two batches when that worker is killed -9 mid-stream
  (from the last batch before the kill to the 16th after it: more than the batches the server
  and the stream held already, which can arrive first), against the median gap before.

Pipelines: the image pipeline on a folder of photo-like JPEGs (``python -m benchmarks.photos DIR``)
with batches of 32 224-px crops, and ``examples.synthetic``. The new checkout also runs spawned
workers (one per pipeline), for the CPU per batch of a forked worker against a spawned one. And a
user's script that starts a server through the Python API under ``if __name__ == "__main__":``
says how its workers started, in each checkout.

    python -m benchmarks.worker_start --photos DIR [--trees old=PATH,new=.] [--stream-s 10] [--repeats 1] [--json FILE]
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import cli, report
from benchmarks.common.node_tree import node_tree, tree_memory
from benchmarks.common.proc import usage

TOKEN = "b" * 32
SYNTHETIC = {"size": 1024, "batch_size": 32, "shape": [3, 64, 64]}
KILL_WATCH_S = 60.0  # the longest the stream is watched after the kill
KILL_COUNT = 16      # batches after the kill watched: more than the stream's window and the worker's slots
USER_SCRIPT = '''
import json, sys
from data_service import DataServer, PipelineSpec, ServerOptions

if __name__ == "__main__":
    server = DataServer(PipelineSpec("examples.synthetic:build_pipeline", {"size": 64}), "t" * 32,
                        ServerOptions(num_workers=1, probe=False)).start()
    pids = server.pool.worker_pids()
    import psutil
    print(json.dumps({"method": (getattr(server.pool, "starter", None) or server.pool.launcher).method,
                      "parent_is_server": psutil.Process(pids[0]).ppid() == psutil.Process().pid}))
    server.shutdown(grace_s=0.5)
'''


def _pipeline(name: str, photos: str) -> tuple[str, dict]:
    if name == "image":
        return "data_service.pipelines.images:build_pipeline", {"data_dir": photos, "batch_size": 32}
    return "examples.synthetic:build_pipeline", SYNTHETIC


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"the server did not listen within {timeout:.0f}s")


def _num_batches(address: str) -> int:
    from dnn_worker import ControlClient

    with ControlClient(address, TOKEN) as ctl:
        info = ctl.wait_hello(60).dataset
    return info.num_samples // info.batch_size if info.drop_last else -(-info.num_samples // info.batch_size)


def point(tree: str, name: str, workers: int, start: str, stream_s: float, photos: str, log: Path) -> dict:
    """One server from checkout ``tree``; the figures listed in the module docstring."""
    from benchmarks.common.stream import Stream

    target, opts = _pipeline(name, photos)
    port, bulk = _free_port(), _free_port()
    cmd = [sys.executable, "-m", "hetero", "--log-level", "WARNING", "serve", target, "--host", "127.0.0.1",
           "--port", str(port), "--bulk-port", str(bulk), "--workers", str(workers),
           "--token", TOKEN, "--worker-start", start]
    cmd += [a for k, v in opts.items() for a in ("-o", f"{k}={json.dumps(v)}")]
    with open(log, "a") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=tree), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    stream = None
    try:
        _wait_port(port, proc, 300)
        address = f"127.0.0.1:{port}"
        stream = Stream(address, TOKEN, _num_batches(address))
        first = stream.wait_first(120)
        nodes = node_tree(proc.pid)
        warmup = first + min(3.0, stream_s / 3)
        time.sleep(max(0.0, warmup - time.monotonic()))
        cpu0, t1 = usage(list(nodes.workers))[0], time.monotonic()
        time.sleep(max(0.0, first + stream_s - time.monotonic()))
        cpu1, t2 = usage(list(nodes.workers))[0], time.monotonic()
        built = stream.count(t1, t2)
        row = {"tree": Path(tree).name, "pipeline": name, "workers": workers,
               "start": "warm" if nodes.parent else "spawn", "first_batch_s": round(first - t0, 2),
               "batches_per_s": round(built / (t2 - t1), 1),
               "cpu_ms_per_batch": round(1000 * (cpu1 - cpu0) / max(built, 1), 1), **tree_memory(nodes),
               "spare_cpu_s": round(usage([nodes.spare])[0], 2) if nodes.spare else 0.0}
        if workers == 1:
            before = stream.median_gap(t1, t2)
            kill = time.monotonic()
            os.kill(nodes.workers[0], signal.SIGKILL)
            # the batches the server held built, queued or in flight may arrive before the stream
            # waits on the replacement: watch until more than those came after the kill
            back = stream.wait_after(kill, KILL_COUNT, KILL_WATCH_S)
            row.update(median_gap_s=round(before, 3), kill_gap_s=round(stream.longest_gap_after(kill, back), 3))
        if stream.error is not None:
            raise RuntimeError(f"the stream failed: {stream.error!r}")
        return row
    finally:
        if stream is not None:
            stream.stop()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def bare_import(modules: str = "torch, torchvision") -> float:
    """Wall seconds of a fresh ``python -c "import <modules>"``, interpreter start included."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", f"import {modules}"], check=True, timeout=300)
    return time.monotonic() - t0


def user_script(tree: str) -> dict:
    """How a server started through the Python API in a user's script starts its workers."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(USER_SCRIPT)
        out = subprocess.run([sys.executable, str(script)], cwd=tmp, capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, PYTHONPATH=tree))
    if out.returncode != 0:
        raise RuntimeError(f"the user's script failed in {tree}:\n{out.stderr[-2000:]}")
    return {"tree": Path(tree).name, **json.loads(out.stdout.strip().splitlines()[-1])}


def _merged(rows: list[dict]) -> dict:
    """One point's rounds as one row: the median of each figure; per-worker lists joined, sorted."""
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, list):
            out[key] = sorted(v for r in rows for v in r[key])
        elif isinstance(value, (int, float)) and key != "workers":
            out[key] = report.medians(rows, [key])[key]
    out["rounds"] = len(rows)
    return out


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.0f}" if round(low) == round(high) else f"{low:.0f}-{high:.0f}"


def _trees(text: str) -> dict[str, str]:
    return {k: str(Path(v).resolve()) for k, v in (pair.split("=", 1) for pair in text.split(","))}


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, "python -m benchmarks.worker_start")
    p.add_argument("--photos", required=True, help="a folder of photo-like JPEGs (python -m benchmarks.photos DIR)")
    p.add_argument("--trees", default="new=.", help="label=checkout pairs, comma-separated (old=../old,new=.)")
    p.add_argument("--stream-s", type=float, default=10.0, help="seconds of streaming before memory is read")
    p.add_argument("--pipelines", default="image,synthetic")
    p.add_argument("--repeats", type=int, default=1, help="rounds of every point; medians are reported")
    p.add_argument("--log", default="", help="the servers' output (default: a temporary file)")
    cli.add_json(p)
    args = p.parse_args(argv)
    trees, names = _trees(args.trees), args.pipelines.split(",")
    log = Path(args.log or tempfile.mkstemp(prefix="worker_start-", suffix=".log")[1])
    bare, runs = [], {}
    newest = list(trees.values())[-1]
    for _ in range(args.repeats):  # each point once per round, the checkouts alternated
        for name in names:
            for workers in (1, 2):
                for label, tree in trees.items():  # so that the machine's other load falls on both alike
                    if workers == 1:
                        bare.append(bare_import())
                    row = point(tree, name, workers, "warm", args.stream_s, args.photos, log)
                    runs.setdefault((label, name, workers, "warm"), []).append({**row, "tree": label})
            row = point(newest, name, 1, "spawn", args.stream_s, args.photos, log)
            runs.setdefault((list(trees)[-1], name, 1, "spawn"), []).append({**row, "tree": list(trees)[-1]})
    api = [{**user_script(tree), "tree": label} for label, tree in trees.items()]
    bare_s = report.medians([{"s": s} for s in bare])["s"]
    rows = [_merged(r) for r in runs.values()]
    pss = {(r["tree"], r["pipeline"], r["workers"]): r["all_pss_mb"] for r in rows if r["start"] == "warm"}
    for r in rows:
        one = pss.get((r["tree"], r["pipeline"], 1))
        if r["workers"] == 2 and one is not None and r["start"] == "warm":
            r["marginal_mb"] = round(r["all_pss_mb"] - one, 1)
        r["first_vs_bare"] = round(r["first_batch_s"] / bare_s, 2)
    print(f"{report.command('python -m benchmarks.worker_start', argv)}  ({report.stamp()})")
    print(f"bare `import torch, torchvision` (fresh interpreter): {bare_s:.2f} s (median of {len(bare)})")
    print(f"{'tree':>5} {'pipeline':>9} {'N':>2} {'start':>5} | {'worker USS':>10} {'own':>9} {'slots':>5} "
          f"{'parent':>6} {'spare':>5} {'main':>5} {'all PSS':>7} {'+PSS':>5} MB | {'1st batch':>9} {'x bare':>6} | "
          f"{'batch/s':>7} {'CPU/batch':>9} ms | {'kill gap':>8} {'median':>6} s")
    for r in rows:
        uss, mine = _span(r["worker_uss_mb"]), _span(r["worker_own_mb"])
        marginal = f"{r['marginal_mb']:.0f}" if "marginal_mb" in r else "-"
        gap = f"{r['kill_gap_s']:>8.3f} {r['median_gap_s']:>6.3f}" if "kill_gap_s" in r else f"{'-':>8} {'-':>6}"
        print(f"{r['tree']:>5} {r['pipeline']:>9} {r['workers']:>2} {r['start']:>5} | {uss:>10} {mine:>9} "
              f"{max(r['worker_slots_mb']):>5.0f} {r['parent_uss_mb']:>6.0f} {r['spare_uss_mb']:>5.0f} "
              f"{r['main_uss_mb']:>5.0f} {r['all_pss_mb']:>7.0f} {marginal:>5}    | {r['first_batch_s']:>9.2f} "
              f"{r['first_vs_bare']:>6.2f} | {r['batches_per_s']:>7.1f} {r['cpu_ms_per_batch']:>9.1f}    | {gap}")
    for a in api:
        print(f"Python API under `if __name__ == '__main__':` ({a['tree']}): workers {a['method']}"
              f"{', children of the server' if a['parent_is_server'] else ', forked from the warm parent'}")
    report.write_json(args.json, {"date": report.stamp(), "bare_import_s": bare_s, "points": rows, "python_api": api,
                                  "rounds": [r for rs in runs.values() for r in rs]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
