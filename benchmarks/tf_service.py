"""End to end with one data core: our data server against tf.data service, the same files and step.

Both sides serve the same photo-like JPEGs (:mod:`benchmarks.photos`) as batches of 32 random
224 px crops, flipped at random, as uint8, from ONE pinned core (ours: ``hetero serve`` with one
worker; tf.data service: dispatcher + worker in one process), to a trainer loop on another core
that takes a batch and sleeps the emulated accelerator step. The step is a third of one core's
batch time of our pipeline (as the quickstart picks it), so both sides are data-bound and the step
time measures the data path. Rounds alternate ours / tf (fused ``decode_and_crop_jpeg``) / tf
(``decode_jpeg`` then crop); medians reported, with the data side's CPU seconds per batch.

    python -m benchmarks.tf_service --images-dir /tmp/photos --images 3872 --rounds 3 \\
        --peers-python /path/to/venv-with-tensorflow/bin/python

Kept out of the tests: TensorFlow is optional (the ``peers`` extra, best in its own venv).
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import cli, report
from benchmarks.common.consume import epochs
from benchmarks.common.proc import tree_cpu

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = "data_service.pipelines.images:build_pipeline"
BATCH = 32


def ours(folder: str, images: int, step_s: float, steps: int, warmup: int, data_cpu: int, decode: str) -> dict:
    """Our data server (one worker) pinned to ``data_cpu``; RemoteDataset + sleep here."""
    from dnn_worker import RemoteDataset
    from hetero.testing.processes import TOKEN, ServerProc

    options = {"data_dir": folder, "limit": images, "batch_size": BATCH, "decode": decode}
    server = ServerProc(options, workers=1, pipeline=PIPELINE)
    server.cmd = ["taskset", "-c", str(data_cpu), *server.cmd]
    server.start()
    try:
        ds = RemoteDataset([server.address], TOKEN, seed=1, epochs=1000)
        cpu0, start = 0.0, 0.0
        for step, _ in enumerate(itertools.islice(epochs(ds), steps), 1):  # each fetch is inside the step it feeds
            time.sleep(step_s)
            if step == warmup:
                cpu0, start = tree_cpu(server.proc.pid), time.perf_counter()
        wall = time.perf_counter() - start
        cpu = tree_cpu(server.proc.pid) - cpu0
    finally:
        server.stop()
    n = steps - warmup
    return {"step_s": wall / n, "data_cpu_per_batch_s": cpu / n}


def tf_service(python: str, files_json: str, step_s: float, steps: int, warmup: int, data_cpu: int,
               trainer_cpu: int, decode: str) -> dict:
    from hetero.ports import free_port

    port = free_port()
    # Run from ROOT, so the peers' interpreter finds the module without this repository installed.
    peer = [python, "-m", "benchmarks.common.tfdata"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    server = subprocess.Popen([*peer, "server", "--port", str(port), "--cpu", str(data_cpu)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        if server.stdout.readline().strip() != "ready":
            return {"skipped": f"tf.data service did not start ({python}: is tensorflow installed?)"}
        out = subprocess.run([*peer, "trainer", "--port", str(port), "--cpu", str(trainer_cpu),
                              "--files", files_json, "--decode", decode, "--step-s", str(step_s),
                              "--steps", str(steps), "--warmup", str(warmup), "--server-pid", str(server.pid)],
                             cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
        if out.returncode != 0:
            return {"skipped": (out.stderr.strip().splitlines() or ["no output"])[-1][:200]}
        res = json.loads(out.stdout.strip().splitlines()[-1])
        return {"step_s": res["wall_per_step_s"], "data_cpu_per_batch_s": res["data_cpu_per_batch_s"]}
    finally:
        server.kill()
        server.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--images-dir", default="/tmp/photos")
    ap.add_argument("--images", type=int, default=3872)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--step-s", type=float, default=0.0, help="emulated step (0: a third of one core's batch time)")
    ap.add_argument("--data-cpu", type=int, default=1)
    ap.add_argument("--trainer-cpu", type=int, default=0)
    ap.add_argument("--peers-python", default=sys.executable, help="interpreter with tensorflow")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    from benchmarks.photos import photo_files, write_photo_folder
    from hetero.planning.profile import profile_pipeline

    os.sched_setaffinity(0, {args.trainer_cpu})
    write_photo_folder(args.images_dir, args.images)
    files = photo_files(args.images_dir, args.images)
    files_json = str(Path(args.images_dir).resolve().parent / ".tf-service-files.json")
    with open(files_json, "w") as f:
        json.dump(files, f)
    step_s = args.step_s
    if not step_s:
        prof = profile_pipeline(PIPELINE, {"data_dir": args.images_dir, "limit": args.images, "batch_size": BATCH},
                                batches=10, cpu=args.data_cpu)
        step_s = round(prof.median_s / 3, 4)
        print(f"our pipeline: {prof.median_s * 1000:.1f} ms per batch on CPU {args.data_cpu}; emulated step "
              f"{step_s * 1000:.1f} ms (a third)")
    print(f"{len(files)} JPEGs, batch {BATCH}, data on CPU {args.data_cpu}, trainer on CPU {args.trainer_cpu}, "
          f"{args.steps} steps ({args.warmup} warm-up), {report.stamp()}")
    sides = {"ours (fused)": lambda: ours(args.images_dir, args.images, step_s, args.steps, args.warmup,
                                          args.data_cpu, "fused"),
             "tf.data service (decode_and_crop_jpeg)": lambda: tf_service(
                 args.peers_python, files_json, step_s, args.steps, args.warmup, args.data_cpu, args.trainer_cpu,
                 "fused"),
             "ours (decode=whole)": lambda: ours(args.images_dir, args.images, step_s, args.steps, args.warmup,
                                                 args.data_cpu, "whole"),
             "tf.data service (decode_jpeg)": lambda: tf_service(
                 args.peers_python, files_json, step_s, args.steps, args.warmup, args.data_cpu, args.trainer_cpu,
                 "whole")}
    results: dict[str, list[dict]] = {k: [] for k in sides}
    for r in range(args.rounds):
        for name, run in sides.items():
            res = run()
            results[name].append(res)
            shown = (f"{res['step_s'] * 1000:.1f} ms/step, data CPU {res['data_cpu_per_batch_s'] * 1000:.1f} ms/batch"
                     if "step_s" in res else f"skipped: {res['skipped']}")
            print(f"  round {r + 1} {name}: {shown}", flush=True)
    summary = {"step_s": step_s, "images": len(files)}
    base = None
    print(f"\n| side | ms/step | data CPU ms/batch | vs tf.data service (decode_and_crop_jpeg) |\n|---|---|---|---|")
    med = {}
    for name, runs in results.items():
        ok = [x for x in runs if "step_s" in x]
        if ok:
            med[name] = (statistics.median(x["step_s"] for x in ok),
                         statistics.median(x["data_cpu_per_batch_s"] for x in ok))
    base = med.get("tf.data service (decode_and_crop_jpeg)", (None,))[0]
    for name, (s, c) in med.items():
        print(f"| {name} | {s * 1000:.1f} | {c * 1000:.1f} | {s / base:.2f} |" if base else
              f"| {name} | {s * 1000:.1f} | {c * 1000:.1f} | n/a |")
    summary["median"] = {k: {"step_s": v[0], "data_cpu_per_batch_s": v[1]} for k, v in med.items()}
    summary["runs"] = results
    report.write_json(args.json, summary, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
