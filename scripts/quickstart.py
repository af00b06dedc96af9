"""The quickstart: the image-folder job on this machine, homogeneous vs heterogeneous, with the reason.

    .venv/bin/python scripts/quickstart.py [--output out/quickstart] [--steps 80] [--batch-size 32]

1. Writes a JPEG image folder of drawn shapes (kept in OUTPUT/images for the next run).
2. Profiles one batch of ``data_service.pipelines.images:build_pipeline`` (decode, RandomResizedCrop(224),
   flip) on one core, beside the same with whole-image decoding (what the fused crop-and-decode
   buys), and sets the emulated accelerator step to a third of that time, so that
   one core cannot keep up with the "accelerator": the homogeneous node is CPU-bound, as an
   image job on a GPU instance with a few vCPUs is. (No GPU here: the step is a sleep.)
3. Runs the job twice with ``hetero local``: homogeneous (one node on CPU 0, preprocessing in
   its own data server's worker, as a data node builds them) and heterogeneous (the same node on CPU 0, serving batches from its
   own core too, plus a data node on the other CPUs; no loader worker, the launcher's default
   there, since batches arrive built).
4. Prints both step times, data wait, the speed-up and the planner's prediction for each, and
   writes OUTPUT/quickstart.png.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PIPELINE = "data_service.pipelines.images:build_pipeline"
# Steps left out of the averages: start-up, and the batches servers and loaders built ahead while
# the trainer started, which would otherwise flatter whichever mode buffers more.
WARMUP = 20


def ensure_images(folder: Path, images: int, classes: int) -> int:
    """Write the image folder unless a complete one is there; returns the image count."""
    from hetero.synthetic.images import write_image_folder

    per_class = -(-images // classes)
    if len(list(folder.glob("*/*.jpg"))) == per_class * classes:
        return per_class * classes
    print(f"writing {per_class * classes} JPEG images ({classes} classes, 300-500 px) to {folder} ...", flush=True)
    write_image_folder(folder, per_class=per_class, classes=classes, seed=0, threads=len(os.sched_getaffinity(0)))
    return per_class * classes


def fused_note(ratio: float) -> str:
    """What the fused decode's measured ratio of images per core means for the data group."""
    if ratio >= 1.1:
        return f"{ratio:.2f}x the images per core, so a data group that many times smaller feeds the same accelerators"
    return (f"{ratio:.2f}x the images per core: on these images about the same, so no smaller data group "
            f"(photos gain more: docs/benchmarks.md)")


def load_note(rows: list[tuple[str, float, float]]) -> str:
    """The busy machine's note, naming as longer than the planner's only the step times that are."""
    longer = [name for name, measured, planned in rows if measured > planned]
    if not longer:
        said = "yet neither step time is longer than the planner's (which assumes idle cores)"
    elif len(longer) == len(rows):
        said = "so both step times are longer than the planner's (which assumes idle cores)"
    else:
        said = f"so the {' and '.join(longer)} step time is longer than the planner's (which assumes idle cores)"
    return f"other processes shared these cores, {said}; rerun on a quiet machine for cleaner figures"


def run_mode(homogeneous: bool, images: Path, out: Path, cpus: list[int], hps: dict) -> dict:
    from hetero.local import LocalJob, run_local

    dnn = str(cpus[0])
    data = ",".join(str(c) for c in cpus[1:]) or None
    job = LocalJob(data_nodes=1, dnn_nodes=1, homogeneous=homogeneous, data=images, output=out, echo=False,
                   hyperparameters=dict(hps, **({} if homogeneous else {"dnn_local_server": True})),
                   dnn_cpus=dnn, data_cpus=None if homogeneous else data, timeout_s=600)
    result = run_local(job)
    if not result.ok:
        raise SystemExit(f"quickstart: the {'homogeneous' if homogeneous else 'heterogeneous'} run failed: "
                         f"{result.failure or result.exit_codes}; logs in {out}/logs")
    return result.metrics


def write_png(path: Path, rows: list[tuple[str, float, float, float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r[1] * 1000 for r in rows], width=0.4, label="measured")
    ax.bar([i + 0.2 for i in x], [r[2] * 1000 for r in rows], width=0.4, label="planner")
    for i, r in enumerate(rows):
        ax.text(i - 0.2, r[1] * 1000, f"{r[1] * 1000:.0f} ms\nwait {r[3]:.0%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("step time (ms)")
    ax.set_title(title, fontsize=9)
    ax.margins(y=0.25)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/quickstart.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--output", type=Path, default=ROOT / "out" / "quickstart")
    p.add_argument("--steps", type=int, default=120,
                   help=f"steps per run (default 120; the first {WARMUP} are discarded)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=4)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from hetero.bench.records import derived_step
    from hetero.planning.planner import predict_step
    from hetero.planning.profile import profile_pipeline

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("quickstart: this machine has 1 usable CPU; the heterogeneous run needs a second one for its data "
              "node, so it cannot be faster here")
    out = args.output.resolve()
    images = out / "images"
    count = ensure_images(images, (args.steps + 1) * args.batch_size, args.classes)
    load_before = os.getloadavg()[0]
    options = {"batch_size": args.batch_size, "image_size": 224}
    prof = profile_pipeline(PIPELINE, {**options, "data_dir": str(images)}, batches=6, cpu=cpus[0], warmup=1)
    preprocess_s = prof.median_s
    step_s = derived_step(preprocess_s)
    print(f"\nprofile: one batch of {args.batch_size} JPEGs (decode + RandomResizedCrop(224) + flip) takes "
          f"{preprocess_s * 1000:.1f} ms on one core (median of {len(prof.times_s) - 1}; "
          f"{args.batch_size / preprocess_s:.0f} images/s per core)")
    print(f"emulated accelerator step: {step_s * 1000:.1f} ms = 1/3 of that. Why: a GPU trains a batch faster than "
          f"one CPU core can decode and augment it, so the node's own CPU (1 core here) starves it, and every core "
          f"a data node adds shortens the step until the step itself is the limit.\n")
    whole = profile_pipeline(PIPELINE, {**options, "data_dir": str(images), "decode": "whole"}, batches=6,
                             cpu=cpus[0], warmup=1)
    print(f"the fused crop-and-decode (decode only the random crop of each JPEG, the default) against decoding whole "
          f"images then cropping (decode=whole): {preprocess_s * 1000:.1f} vs {whole.median_s * 1000:.1f} ms per batch, "
          f"{fused_note(whole.median_s / preprocess_s)} (`hetero plan --profile --compare decode=whole` prices both)\n")
    finish_s = prof.finish_s
    print(f"the trainer's own work per batch on its core: the finish stage (uint8 -> normalised float32) takes "
          f"{finish_s * 1000:.1f} ms here (on a GPU it runs on the device)\n")
    hps = {"pipeline": PIPELINE, **{f"pipeline.{k}": v for k, v in options.items()}, "emulate_step_s": step_s,
           "max_steps": args.steps, "warmup_steps": WARMUP, "log_every": 1000, "evaluate": "", "data_workers": 1}
    print(f"== homogeneous: one node on CPU {cpus[0]}, preprocessing in its own data server's worker", flush=True)
    homo = run_mode(True, images, out / "homo", cpus, {**hps, "loader_workers": 1})
    print(f"== heterogeneous: the same node on CPU {cpus[0]} (serving from its own core too) + a data node on "
          f"CPU(s) {','.join(map(str, cpus[1:]))}", flush=True)
    hetero = run_mode(False, images, out / "hetero", cpus, {**hps, "data_workers": max(1, len(cpus) - 1)})
    pred_homo = predict_step(preprocess_s, step_s, cores=1, trainer_s=finish_s)
    pred_hetero = predict_step(preprocess_s, step_s, cores=len(cpus), trainer_s=finish_s)
    print()
    rows = []
    for name, m, pred in (("homogeneous", homo, pred_homo), ("heterogeneous", hetero, pred_hetero)):
        print(f"{name:>13}: {m['avg_step_time_s'] * 1000:6.1f} ms/step, data wait {m['data_wait_fraction']:.0%}, "
              f"{m['samples_per_s']:.0f} images/s ({m['steps']} steps, {m['warmup_steps_discarded']} warm-up "
              f"discarded); planner: {pred.step_s * 1000:.1f} ms/step, data wait {pred.data_wait_fraction:.0%}")
        rows.append((name, m["avg_step_time_s"], pred.step_s, m["data_wait_fraction"]))
    speedup = homo["avg_step_time_s"] / hetero["avg_step_time_s"]
    print(f"     speed-up: {speedup:.2f}x measured, {pred_homo.step_s / pred_hetero.step_s:.2f}x predicted "
          f"({len(cpus)} cores vs 1 preprocessing; emulated {step_s * 1000:.1f} ms step)")
    load_after = os.getloadavg()[0]
    if max(load_before, load_after) > 0.5 * len(cpus):
        print(f"     note: load average {load_before:.1f} before, {load_after:.1f} after on {len(cpus)} CPUs: "
              f"{load_note([(name, measured, planned) for name, measured, planned, _ in rows])}")
    png = out / "quickstart.png"
    write_png(png, rows, f"{count} JPEGs, batch {args.batch_size}, crop 224, emulated step {step_s * 1000:.1f} ms: "
                         f"speed-up {speedup:.2f}x")
    print(f"     chart: {png}; metrics: {out}/homo/metrics.json, {out}/hetero/metrics.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
