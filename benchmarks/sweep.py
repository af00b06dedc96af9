"""A sweep of 4 jobs on one data node of 2 cores: batches shared through the batch window, or not.

    flock /tmp/bench.lock python -m benchmarks.sweep --images-dir /tmp/sweep-photos --seconds 20 --rounds 2

One ``hetero serve`` with 2 workers builds the image pipeline (photo-like JPEGs, fused crop
decode, flip, ``--image-size`` px crops, batches of 32) for 4 jobs. Each job is a training loop
(``RemoteDataset`` over TCP, as from a GPU node, its audit log on) that sleeps an emulated
accelerator step after each batch: the node's time per batch as one job alone measures it first
(no step, ``--calibrate-seconds``), so one job alone keeps the node's cores busy. The jobs stand
for GPU nodes, so their own CPU (receiving, checking and auditing 4 streams of batches) must not
come out of the data node's: by default the data node (server and workers) runs under a CPU quota
of ``--node-cores`` (this machine's cores - 0.4: 1.6 of 2) and the jobs get the rest
(benchmarks/common/cpu_split.py); ``--node-cores 0`` lets them share every core. The table says
how many cores each used, and the images each CPU second of the data node gave. Per case, the two
layouts run side by side in one run, on the same cores, for ``--seconds`` each (rounds alternate
them):

* **shared**: ``--batch-window`` of ``--window-batches`` batches; the jobs share each batch built;
* **not shared**: no window; each job's batches are built for it;
* **shared, no build-ahead** (with ``--without-build-ahead``): the shared layout with the
  server's ``--build-ahead 0``, beside the other two, so the next epoch's first batches built
  ahead are measured against the same window without them.

Cases: ``equal`` (4 jobs, one seed, one step); ``half`` (one of them at half speed: its step
twice as long); ``own-seeds`` (4 seeds, so no batch is shared: shared means the decoded-image
cache, ``decoded_cache_bytes``, against the plain fused pipeline). Reported: aggregate images/s
over the measured span (from the moment every job has its first batch), each job's step time
and data wait, batches built and built again, the window's largest size against its budget, and
each job's audit against its own in-process run (delivered, wrong, skipped, duplicated).

The bound printed beside the half-speed figure is the model in docs/sweep.md: while the slow job
is within the window (the first 2W/C seconds, W window batches, C the node's batches/s) the
sweep runs at 3.5x; after it, the node builds for the fast jobs and, again, for the slow one,
2.0x; over D seconds: 2 + 3W/(C D), at most 3.5.
"""
from __future__ import annotations

import contextlib
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import cli, report
from benchmarks.common.cpu_split import CpuSplit
from benchmarks.common.proc import tree_cpu
from benchmarks.common.sweep_jobs import JobRecord, References, audit, run_job

PIPELINE = "data_service.pipelines.images:build_pipeline"
JOBS = 4
WORKERS = 2


Layout = tuple[dict, "str | None", list[int], "int | None"]  # options, --batch-window, seeds, --build-ahead


def layouts(case: str, base: dict, window_bytes: int, without_ahead: bool = False,
            ahead: int | None = None) -> dict[str, Layout]:
    """Per layout: (pipeline options, --batch-window, each job's seed, --build-ahead: ``ahead``, None
    for the server's default)."""
    if case == "own-seeds":
        cached = {**base, "decoded_cache_bytes": "256MB"}
        return {"shared": (cached, None, [1, 2, 3, 4], None), "not shared": (base, None, [1, 2, 3, 4], None)}
    out: dict[str, Layout] = {"shared": (base, str(window_bytes), [1] * JOBS, ahead),
                              "not shared": (base, None, [1] * JOBS, None)}
    if without_ahead:
        out["shared, no build-ahead"] = (base, str(window_bytes), [1] * JOBS, 0)
    return out


SPLIT: CpuSplit | None = None  # the node's and the jobs' cores (--node-cores), set by main


def run_layout(options: dict, window: str | None, seeds: list[int], steps: list[float], seconds: float,
               tmp: str, tag: str, build_ahead: int | None = None) -> dict:
    """One layout: a server, a job per seed for ``seconds`` after all have their first batch; figures."""
    from data_service.server.stats import WindowFigures
    from dnn_worker import ControlClient
    from hetero.testing.processes import TOKEN, ServerProc

    server = ServerProc(options, workers=WORKERS, slots=4, pipeline=PIPELINE, batch_window=window,
                        build_ahead=build_ahead, log_path=Path(tmp) / f"server-{tag}.log")
    with SPLIT.node() if SPLIT is not None else contextlib.nullcontext():
        server.start(wait=False)  # the server, its warm parent and workers: all in the node's cgroup
    server.wait_ready(300)
    records = [JobRecord(f"job{k}", seeds[k], steps[k], str(Path(tmp) / f"audit-{tag}-{k}.jsonl"))
               for k in range(len(seeds))]
    barrier = threading.Barrier(len(seeds))
    threads = [threading.Thread(target=run_job, args=(r, server.address, TOKEN, barrier), daemon=True)
               for r in records]
    try:
        with ControlClient(server.address, TOKEN) as ctl:
            for t in threads:
                t.start()
            deadline = time.monotonic() + 300
            while not all(r.arrivals or r.error for r in records):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{tag}: a job had no first batch within 300 s; server log "
                                       f"{server.log_path}")
                time.sleep(0.05)
            start = time.monotonic()
            before = ctl.stats()
            node0, jobs0, load0 = tree_cpu(server.proc.pid), time.process_time(), os.getloadavg()[0]
            held0 = SPLIT.throttled_s() if SPLIT is not None else (0.0, 0.0)
            end = start + seconds
            most = 0.0
            while time.monotonic() < end:
                most = max(most, (WindowFigures.of(ctl.stats()) or WindowFigures()).held_bytes)
                time.sleep(0.25)
            after = ctl.stats()
            node_cpu, jobs_cpu = tree_cpu(server.proc.pid) - node0, time.process_time() - jobs0
            held = [b - a for a, b in zip(held0, SPLIT.throttled_s() if SPLIT is not None else (0.0, 0.0))]
    finally:
        for r in records:  # each job stops after its current step
            r.stop_at = 0.0
        for t in threads:
            t.join(60)
        server.stop()
    built = after.batches_built - before.batches_built

    def grew(name: str) -> float:
        return getattr(WindowFigures.of(after) or WindowFigures(), name) - getattr(WindowFigures.of(before) or WindowFigures(), name)

    again = grew("built_again")
    jobs = [{"name": r.name, "seed": r.seed, "step_s": r.step_s, "error": r.error, **r.figures(start, end)}
            for r in records]
    return {"jobs": jobs, "records": records, "batches": sum(j["batches"] for j in jobs), "seconds": seconds,
            "built": built, "built_again": again, "built_ahead": grew("built_ahead"),
            "ahead_used": grew("ahead_used"), "window_max_bytes": most,
            "window_budget": (WindowFigures.of(after) or WindowFigures()).budget_bytes,
            # where the machine's cores went: the data node (server and workers), the 4 jobs (this
            # process), and how loaded the machine was (other people's work included)
            "node_cores": node_cpu / seconds, "jobs_cores": jobs_cpu / seconds, "load": (load0, os.getloadavg()[0]),
            # seconds per second each group was held back at its quota (the node's, the jobs')
            "node_held": held[0] / seconds, "jobs_held": held[1] / seconds}


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__, prog="python -m benchmarks.sweep")
    ap.add_argument("--images-dir", default="/tmp/sweep-photos")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per layout and round")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per case (layouts alternate); medians reported")
    ap.add_argument("--window-batches", type=int, default=64)
    ap.add_argument("--cases", default="equal,half,own-seeds")
    ap.add_argument("--without-build-ahead", action="store_true",
                    help="also run the shared layout with the server's --build-ahead 0 (same seed cases)")
    ap.add_argument("--build-ahead", type=int, default=None,
                    help="the shared layout's server --build-ahead (default: the server's own)")
    ap.add_argument("--step-s", type=float, default=0.0, help="fast jobs' emulated step (0: the node's time per "
                    "batch, measured with one job alone for --calibrate-seconds)")
    ap.add_argument("--calibrate-seconds", type=float, default=8.0)
    ap.add_argument("--node-cores", type=float, default=None,
                    help="the data node's cores, a CPU quota (cgroup) for its server and workers; the jobs get the "
                         "rest, so their own CPU never comes out of the node's, as on a cluster where they run on GPU "
                         "nodes (default: this machine's cores - 0.4; 0: no quotas, node and jobs share every core)")
    cli.add_json(ap)
    args = ap.parse_args(argv)
    from benchmarks.photos import write_photo_folder

    global SPLIT
    cores = len(os.sched_getaffinity(0))
    node_cores = cores - 0.4 if args.node_cores is None else args.node_cores
    if node_cores:
        SPLIT = CpuSplit(node_cores)
        if not SPLIT.available:
            print(f"--node-cores {node_cores:g}: no cpu cgroup can be made here (root and cgroup v1's cpu "
                  "controller are needed): node and jobs share every core", flush=True)
            SPLIT.close()
            SPLIT = None

    write_photo_folder(args.images_dir, args.images)
    base = {"data_dir": args.images_dir, "limit": args.images, "batch_size": args.batch_size,
            "image_size": args.image_size}
    cpu_batch = cpu_seconds_per_batch_of(base)
    batch_bytes = args.batch_size * args.image_size ** 2 * 3 + args.batch_size * 8 + 1024  # payload + header
    window_bytes = args.window_batches * batch_bytes
    per_epoch = args.images // args.batch_size
    where = (f"{SPLIT.node_cores:g} of this machine's {cores} cores (a CPU quota; the jobs get the other "
             f"{SPLIT.jobs_cores:g})" if SPLIT is not None else f"this machine's {cores} cores, shared with the jobs")
    print(f"{report.stamp()}: {JOBS} jobs, one data node of {WORKERS} workers on {where}, {args.images} photo-like "
          f"JPEGs, batches of {args.batch_size} x "
          f"{args.image_size} px ({batch_bytes} bytes); one core's CPU per batch {cpu_batch * 1000:.1f} ms; fast "
          f"jobs' step {f'{args.step_s * 1000:.1f} ms' if args.step_s else 'measured per case'}; window "
          f"{args.window_batches} batches = {window_bytes} bytes; {args.seconds:g} s per layout; load average "
          f"{os.getloadavg()[0]:.1f} at the start", flush=True)
    refs = References(PIPELINE)
    summary: dict = {"command": report.command("python -m benchmarks.sweep", argv), "date": report.stamp(),
                     "cpu_batch_s": cpu_batch, "window_bytes": window_bytes,
                     "node_cores": SPLIT.node_cores if SPLIT is not None else float(cores), "cases": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
            for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
                step = args.step_s or calibrate(base, args.calibrate_seconds, tmp, case)
                summary["cases"][case] = run_case(case, args, base, step, window_bytes, per_epoch, refs, tmp)
                summary["cases"][case]["step_s"] = step
    finally:
        refs.close()
        if SPLIT is not None:
            SPLIT.close()
    report.write_json(args.json, summary, default=str)
    return 0


def calibrate(base: dict, seconds: float, tmp: str, case: str) -> float:
    """The node's time per batch now, as one job alone without a step measures it (the machine's load
    changes from minute to minute, so each case measures it first)."""
    alone = run_layout(base, None, [0], [0.0], seconds, tmp, f"calibrate-{case}")
    step = round(seconds / max(alone["batches"], 1), 4)
    print(f"{case}: one job alone, no step: {alone['batches'] / seconds:.1f} batches/s from the node: the fast "
          f"jobs' step is {step * 1000:.1f} ms", flush=True)
    return step


def run_case(case: str, args, base: dict, step: float, window_bytes: int, per_epoch: int, refs: References,
             tmp: str) -> dict:
    """Both layouts of one case, ``args.rounds`` times alternated; prints its table, returns its figures."""
    steps = [step] * JOBS
    if case == "half":
        steps[-1] = 2 * step
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for name, (options, window, seeds, ahead) in layouts(case, base, window_bytes, args.without_build_ahead,
                                                             args.build_ahead).items():
            res = run_layout(options, window, seeds, steps, args.seconds, tmp, f"{case}-{name}-{r}".replace(" ", ""),
                             ahead)
            with SPLIT.unlimited() if SPLIT is not None else contextlib.nullcontext():  # in-process references
                res["audits"] = [audit(rec, options, refs, per_epoch) for rec in res.pop("records")]
            runs.setdefault(name, []).append(res)
            print(f"  {case} round {r + 1} {name}: {res['batches'] * args.batch_size / args.seconds:.1f} images/s",
                  flush=True)
    return show(case, runs, args, window_bytes)


def cpu_seconds_per_batch_of(options: dict) -> float:
    """One core's CPU seconds per batch of the pipeline (not stretched by other processes' load)."""
    import statistics as st

    from data_service.contract.pipeline import PipelineSpec, build_batch

    pipe = PipelineSpec(PIPELINE, options).load()
    cfg = pipe.epoch_shape()
    times = []
    for i in range(9):
        t0 = time.process_time()
        build_batch(pipe, cfg, 99, 0, i % cfg.num_batches)
        times.append(time.process_time() - t0)
    return st.median(times[1:])


def show(case: str, runs: dict[str, list[dict]], args, window_bytes: int) -> dict:
    """Print the case's table and audits; return its figures."""
    rate = {name: statistics.median(r["batches"] * args.batch_size / r["seconds"] for r in rs)
            for name, rs in runs.items()}
    ratio = rate["shared"] / rate["not shared"] if rate["not shared"] else float("nan")
    c = rate["not shared"] / args.batch_size  # the node's batches/s, each built for one job
    bound = {"equal": "4.0x (each batch built once for 4 jobs)",
             "half": f"{min(3.5, 2 + 3 * args.window_batches / (c * args.seconds)):.2f}x for W={args.window_batches}, "
                     f"C={c:.1f} batches/s, D={args.seconds:g} s (2 + 3W/(C D); 2.0x in the long run)",
             "own-seeds": "per image: one decode and 4 cached crops against 4 fused decodes"}[case]
    if case == "half":
        fast, slow = runs["shared"][-1]["jobs"][0], runs["shared"][-1]["jobs"][-1]
        if slow["batches"] >= 0.9 * fast["batches"]:
            bound += ("; here the jobs ran in step: the node delivered no faster than the slow job asks, so it "
                      "never fell out of the window (the bound assumes the node outruns it)")
    print(f"\n### {case}: shared {rate['shared']:.1f} images/s, not shared {rate['not shared']:.1f} images/s: "
          f"**{ratio:.2f}x**; bound {bound}\n")
    print("| layout | job | seed | step ms (emulated) | step ms | data wait ms | batches | audit: delivered / wrong / "
          "skipped / duplicated |\n|---|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        last = rs[-1]
        for job, a in zip(last["jobs"], last["audits"]):
            print(f"| {name} | {job['name']} | {job['seed']} | {job['step_s'] * 1000:.1f} | {job['step_ms']:.1f} | "
                  f"{job['wait_ms']:.1f} | {job['batches']} | {a['delivered']} / {a['wrong']} / {a['skipped']} / "
                  f"{a['duplicated']} |{' ' + job['error'] if job['error'] else ''}")
    print("\n| layout | round | images/s | batches built | built again | built ahead (asked) | window max bytes / "
          "budget | data node cores | jobs' cores | held at quota, node / jobs (s per s) | images per data-node CPU s "
          "| load average |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        for r, res in enumerate(rs, 1):
            images = res["batches"] * args.batch_size
            print(f"| {name} | {r} | {images / res['seconds']:.1f} | {res['built']} | {res['built_again']:.0f} | "
                  f"{res['built_ahead']:.0f} ({res['ahead_used']:.0f}) | "
                  f"{res['window_max_bytes']:.0f} / {res['window_budget']:.0f} | {res['node_cores']:.2f} | "
                  f"{res['jobs_cores']:.2f} | {res['node_held']:.3f} / {res['jobs_held']:.3f} | "
                  f"{images / max(res['node_cores'] * res['seconds'], 1e-9):.0f} | "
                  f"{res['load'][0]:.1f}-{res['load'][1]:.1f} |")
    per_cpu = {name: statistics.median(r["batches"] * args.batch_size / max(r["node_cores"] * r["seconds"], 1e-9)
                                       for r in rs) for name, rs in runs.items()}
    print(f"\nImages per data-node CPU second: shared {per_cpu['shared']:.0f}, not shared "
          f"{per_cpu['not shared']:.0f}: {per_cpu['shared'] / per_cpu['not shared']:.2f}x")
    if "shared, no build-ahead" in rate and rate["shared, no build-ahead"]:
        print(f"Shared with build-ahead against shared without: {rate['shared']:.1f} / "
              f"{rate['shared, no build-ahead']:.1f} images/s = {rate['shared'] / rate['shared, no build-ahead']:.2f}x "
              f"(without it: {rate['shared, no build-ahead'] / rate['not shared']:.2f}x the not-shared layout)")
    return {"images_per_s": rate, "ratio": ratio, "bound": bound, "images_per_node_cpu_s": per_cpu, "runs": runs}


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # main's finally removes the cgroups
    sys.exit(main())
