"""Step time, data wait and $ cost of the same job, homogeneous vs heterogeneous, on this machine.

``hetero bench`` runs the MNIST job of ``hetero local`` in two layouts, with CPU affinity so each
gets exactly the cores it should:

* **homogeneous**: the trainer and its DataLoader workers on the K *trainer CPUs* (a GPU
  instance's few vCPUs preprocessing for it);
* **heterogeneous**: the same trainer on the same K CPUs (also serving batches from them,
  ``dnn_local_server=true``, unless ``--no-local-server``) plus data node(s) on the M *data CPUs*.

Modes alternate (homo, hetero, hetero, homo, ...) over ``--repeats`` rounds so drift in the
machine's load hits both; figures are medians over rounds, with the min-max spread, and the
speed-up is also given per round (both runs of a round measured back to back). The first
``--warmup`` steps of every run are discarded. With no GPU here the accelerator step is
*emulated* (``--emulate-step-s``: the trainer sleeps instead of computing; 0 = the real CPU
step), so the trainer's own CPU work does not hide the data path. Without ``--emulate-step-s``
the step is a third of one core's batch, profiled at the start of the same run (as the
quickstart does), so the trainer's own core cannot keep up however fast this machine is; the
output says which step it used and why. Each emulated node is priced as the instance type named
on the command line (hetero/planning/cost.py), and the planner's prediction
(hetero/planning/planner.py) from a one-core profile is printed beside the measured step times.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Callable

from launcher.metric_lines import none_measured

from ..planning.cost import load_prices
from ..planning.profile import profile_pipeline

from . import report
from .cpu_monitor import NodeCpuMonitor, cpu_list_text, foreign_share, parse_cpu_list, wait_for_quiet
from .records import MODES, STEP_SHARE, BenchConfig, RunResult, derived_step
from .summary import add_costs, add_network, add_prediction, summarize

log = logging.getLogger(__name__)
# a window line (launcher.metric_lines.window_line), after the log line's time where the log gives one
_WINDOW = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})?.*?step (\d+): avg step time ([\d.]+) s over the last "
                     r"(\d+) steps", re.M)


def logged_windows(log_path: Path) -> list[tuple[float | None, int, int, float]]:
    """Every window a trainer's log holds as (wall-clock time at its end, None where the line has
    none; first step; last step; average step time)."""
    import datetime

    if not log_path.is_file():
        return []
    return [(datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() if m[1] else None,
             int(m[2]) - int(m[4]) + 1, int(m[2]), float(m[3]))
            for m in _WINDOW.finditer(log_path.read_text(errors="replace"))]


def step_windows(log_path: Path, warmup: int) -> list[float]:
    """Average step time of each logged window that lies wholly after the warm-up steps."""
    return [avg for _, first, _, avg in logged_windows(log_path) if first > warmup]


def steady_window(log_path: Path, warmup: int) -> tuple[tuple[float, int], tuple[float, int]] | None:
    """(wall-clock time, step) at the end of the first logged window after the warm-up and at the
    end of the last one: the run's steady state (None: fewer than two such windows)."""
    marks = [(when, last) for when, first, last, _ in logged_windows(log_path) if first > warmup and when is not None]
    if len(marks) < 2 or marks[-1][1] <= marks[0][1]:
        return None
    return marks[0], marks[-1]


def cpu_per_step(log_path: Path, warmup: int, monitor) -> dict[str, float]:
    """Each node's CPU seconds per step in the steady state (:func:`steady_window`; each node's CPU
    interpolated from the monitor's samples). Empty when it cannot be measured."""
    window = steady_window(log_path, warmup)
    if window is None:
        return {}
    (t0, s0), (t1, s1) = window
    out = {}
    for usage in monitor.nodes.values():
        c0, c1 = usage.cpu_at(t0), usage.cpu_at(t1)
        if c0 is not None and c1 is not None:
            out[f"{usage.role} {usage.host}"] = (c1 - c0) / (s1 - s0)
    return out


def others_in_steady_state(log_path: Path, warmup: int, monitor) -> dict[int, float]:
    """Each core's share other processes used in the run's steady state (empty: not measured)."""
    window = steady_window(log_path, warmup)
    return {} if window is None else monitor.others_between(window[0][0], window[1][0])


def boundary_costs(log_path: Path, epoch_batches: int, warmup: int) -> list[dict]:
    """For each epoch boundary inside the run: the window holding the first step of the new epoch,
    against the median of the other windows after warm-up; ``extra_s`` is the time the boundary
    added to that window (its steps x the difference)."""
    import statistics

    if not epoch_batches:
        return []
    windows = [(first, last, avg) for _, first, last, avg in logged_windows(log_path) if first > warmup]
    holds = {(first, last): [b for b in range(epoch_batches + 1, last + 1, epoch_batches) if first <= b <= last]
             for first, last, _ in windows}  # the first steps of epochs each window holds
    steady = [avg for first, last, avg in windows if not holds[first, last]]
    if not steady:
        return []
    median = statistics.median(steady)
    return [{"first_step_of_epoch": holds[first, last][0], "window": [first, last], "window_avg_s": avg,
             "steady_median_s": median, "extra_s": (avg - median) * (last - first + 1)}
            for first, last, avg in windows if holds[first, last]]


def boundary_lines(runs: list[dict]) -> list[str]:
    """One line per mode: the median extra time an epoch boundary costs, and each run's."""
    import statistics

    lines = []
    for mode in MODES:
        extras = [b["extra_s"] for r in runs if r["mode"] == mode and r["ok"] for b in r["boundaries"]]
        if not extras:
            continue
        steady = [b["steady_median_s"] for r in runs if r["mode"] == mode and r["ok"] for b in r["boundaries"]]
        lines.append(f"epoch boundary, {mode}: +{statistics.median(extras):.3f} s (median of {len(extras)}; "
                     f"each: {', '.join(f'{e:+.3f}' for e in extras)}) over a steady "
                     f"{statistics.median(steady):.4f} s/step")
    return lines


def run_mode(cfg: BenchConfig, mode: str, round_no: int, data_dir: Path) -> RunResult:
    """Run the job once in ``mode`` with every node pinned; sample each node's CPU use."""
    from ..local import LocalJob, run_local

    hps = cfg.hyperparameters()
    homo = mode == "homogeneous"
    if not homo:
        hps["dnn_local_server"] = cfg.local_server
        if not cfg.loader_workers:
            hps["loader_workers"] = -1  # the launcher's heterogeneous default: batches arrive built
    out = cfg.output / f"{mode}-{round_no}"
    job = LocalJob(data_nodes=cfg.data_nodes, dnn_nodes=1, homogeneous=homo, data=data_dir, output=out,
                   hyperparameters=hps, timeout_s=cfg.timeout_s, dnn_cpus=cpu_list_text(cfg.trainer_cpus),
                   data_cpus=None if homo else cpu_list_text(cfg.data_cpus), echo=False)
    cpus = sorted(cfg.trainer_cpus + ([] if homo else cfg.data_cpus))
    waited, before = wait_for_quiet(cpus, cfg.max_foreign, cfg.quiet_wait_s) if cfg.quiet_wait_s else (0.0, None)
    log.info("round %d: %s run, trainer on CPUs %s%s (waited %.0fs for quiet cores)", round_no, mode,
             cfg.trainer_cpus, "" if homo else f", data on CPUs {cfg.data_cpus}", waited)
    start = time.monotonic()
    with NodeCpuMonitor() as monitor:
        result = run_local(job)
    wall = time.monotonic() - start
    if not result.ok:
        log.error("%s run %d failed (exit codes %s); logs in %s/logs", mode, round_no, result.exit_codes, out)
    nodes = monitor.summary()
    foreign = foreign_share(nodes, monitor.core_busy, cpus)
    m = result.figures
    log.info("round %d: %s run %s: %s, other processes used %s of CPUs %s", round_no, mode,
             "ok" if result.ok else "FAILED", "no metrics.json" if m is None else
             none_measured(m) or f"avg step {m.avg_step_time_s:.4f} s",
             "n/a" if foreign is None else f"{foreign:.0%}", cpus)
    trainer_log = out / "logs" / "algo-1.log"
    return RunResult(mode, round_no, result.ok, wall, result.metrics, nodes, monitor.core_busy,
                     step_windows(trainer_log, cfg.warmup), foreign, waited, before,
                     boundary_costs(trainer_log, cfg.epoch_batches, cfg.warmup),
                     cpu_per_step(trainer_log, cfg.warmup, monitor),
                     others_in_steady_state(trainer_log, cfg.warmup, monitor))


def choose_step(cfg: BenchConfig, batch_s: float) -> tuple[BenchConfig, dict]:
    """The configuration with its emulated step set, and where the step came from: the one given
    (``--emulate-step-s``) or, with none, ``STEP_SHARE`` of ``batch_s``, one core's batch profiled in
    this run. The dict is the summary's ``emulated_step`` (``report.step_note`` words it)."""
    if cfg.emulate_step_s is not None:
        return cfg, {"s": cfg.emulate_step_s, "source": "given", "share": None, "batch_s": batch_s}
    step = derived_step(batch_s)
    return replace(cfg, emulate_step_s=step), {"s": step, "source": "profiled", "share": STEP_SHARE,
                                               "batch_s": batch_s}


def run_benchmark(cfg: BenchConfig, echo: Callable[[str], None] | None = None) -> dict:
    """Profile, run both modes ``cfg.repeats`` times (alternating), and return every figure.

    With no emulated step in ``cfg`` the step is derived from the first profile (``choose_step``);
    ``echo`` is given the line that says which step the runs use, before they start.

    Raises:
        PlanError: unknown instance type (before anything runs). ValueError: bad configuration.
    """
    from ..synthetic.mnist import write_synthetic

    cfg.check()
    table = load_prices(cfg.prices)
    table.info(cfg.dnn_instance), table.info(cfg.data_instance)  # fail now, not after the runs
    cfg.output.mkdir(parents=True, exist_ok=True)
    data_dir = cfg.output / "data"
    images = cfg.train_images()
    if cfg.workload == "images":
        data_dir = cfg.output / "images"
        _image_folder(data_dir, images)
    else:
        write_synthetic(data_dir, images, 0, seed=0)
    options = {**cfg.pipeline_options(), "data_dir": str(data_dir.resolve())}

    def profile(busy: list[int] | None = None):
        if cfg.quiet_wait_s:
            wait_for_quiet(cfg.data_cpus[:1] + (busy or []), cfg.max_foreign, cfg.quiet_wait_s)
        return profile_pipeline(cfg.pipeline, options, batches=cfg.profile_batches, cpu=cfg.data_cpus[0],
                                busy_cpus=busy)

    # a batch's cost on one core with the trainer's cores idle (the homogeneous runs leave the data
    # cores idle alike) and with them busy (the heterogeneous runs keep every core busy)
    profiles = [profile()]
    cfg, step = choose_step(cfg, profiles[0].median_s)
    beside = [profile(cfg.trainer_cpus)]
    log.info("%s", report.step_note(step))
    if echo is not None:
        echo(report.step_note(step))
    started = time.time()
    runs = [run_mode(cfg, mode, i, data_dir) for i in range(cfg.repeats)
            for mode in (MODES if i % 2 == 0 else MODES[::-1])]
    profiles.append(profile())
    beside.append(profile(cfg.trainer_cpus))
    # Other processes only ever slow a profile's wall seconds down: the faster of the two is the
    # better estimate of them (the prediction takes the CPU seconds of both, add_prediction).
    prof = min(profiles, key=lambda p: p.median_s)
    summary = summarize(cfg, runs)
    add_costs(cfg, summary, table)
    # The finish stage runs on the trainer's CPU cores unless a GPU takes it.
    import torch

    add_prediction(cfg, summary, profiles, runs, on_gpu=torch.cuda.is_available(), beside=beside)
    add_network(cfg, summary, table, runs, prof.median_s, prof.bytes_per_sample)
    if cfg.consumer_cpu:
        from .consumer_cpu import measure

        summary["consumer_cpu"] = measure(batch_size=cfg.batch_size)
    summary.update(config={**asdict(cfg), "output": str(cfg.output)}, emulated_step=step, profile=asdict(prof),
                   profiles=[asdict(p) for p in profiles], profiles_beside=[asdict(p) for p in beside],
                   runs=[asdict(r) for r in runs], started_unix=started,
                   machine=_machine())
    return summary


def _image_folder(folder: Path, images: int, classes: int = 4) -> None:
    """A JPEG folder of drawn shapes with at least ``images`` files (kept for the next run)."""
    from ..synthetic.images import write_image_folder

    per_class = -(-images // classes)
    if len(list(folder.glob("*/*.jpg"))) != per_class * classes:
        write_image_folder(folder, per_class=per_class, classes=classes, threads=len(os.sched_getaffinity(0)))


def _machine() -> dict:
    import platform

    return {"cpus_usable": sorted(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
            "load_avg_1m_at_end": os.getloadavg()[0], "python": platform.python_version(),
            "node": platform.node()}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's options (shared by ``python -m hetero.bench.step_time`` and ``hetero bench``)."""
    usable = sorted(os.sched_getaffinity(0))
    d = BenchConfig(usable[:1], usable[1:])
    p.add_argument("--trainer-cpus", default=cpu_list_text(usable[:1]), help="K CPUs of the trainer node (default: first)")
    p.add_argument("--data-cpus", default=cpu_list_text(usable[1:]), help="M CPUs of the data node(s) (default: the rest)")
    p.add_argument("--repeats", type=int, default=d.repeats, help="rounds; each runs both modes")
    p.add_argument("--steps", type=int, default=d.steps, help="steps per run")
    p.add_argument("--warmup", type=int, default=d.warmup, help="steps discarded from each run's averages")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="samples per batch")
    p.add_argument("--augment-repeats", type=int, default=d.augment_repeats, help="MNIST blur passes (CPU cost)")
    p.add_argument("--emulate-step-s", type=float, default=d.emulate_step_s,
                   help="EMULATED accelerator step in seconds (sleep); 0 = real CPU step (default: a third of "
                        "one core's batch, profiled at the start of the run, so the trainer's core is the limit)")
    p.add_argument("--loader-workers", type=int, default=0,
                   help="trainer DataLoader workers in both modes (0: homogeneous one per trainer CPU, "
                        "heterogeneous the launcher's default, none)")
    p.add_argument("--no-local-server", action="store_true", help="trainer CPUs do not build batches in hetero mode")
    p.add_argument("--data-nodes", type=int, default=d.data_nodes, help="emulated data nodes, all on --data-cpus")
    p.add_argument("--synth-train", type=int, default=d.synth_train, help="synthetic images (0: steps x batch)")
    p.add_argument("--epoch-batches", type=int, default=d.epoch_batches,
                   help="batches per epoch (0: the whole run is one epoch); prints what each epoch boundary costs")
    p.add_argument("--log-every", type=int, default=d.log_every, help="steps per step-time window (0: steps / 10)")
    p.add_argument("--consumer-cpu", action="store_true",
                   help="also print the consumer's CPU per batch with and without resume bookkeeping")
    p.add_argument("--workload", choices=("mnist", "images"), default=d.workload,
                   help="mnist: the MNIST job (blur loop, --augment-repeats); images: a JPEG image folder "
                        "(data_service.pipelines.images: decode, RandomResizedCrop(224), flip)")
    p.add_argument("--dnn-instance", default=d.dnn_instance, help="instance type the trainer node stands for")
    p.add_argument("--data-instance", default=d.data_instance, help="instance type each data node stands for")
    p.add_argument("--epoch-samples", type=int, default=d.epoch_samples, help="samples per epoch for $/epoch (MNIST: 60000)")
    p.add_argument("--prices", default=None, help="price file merged over hetero/planning/prices.json")
    p.add_argument("--output", type=Path, default=d.output, help="run outputs (metrics, logs) land here")
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--png", type=Path, default=None, help="write a chart (step time, $/1000 steps) here")
    p.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds before a run is stopped")
    p.add_argument("--max-foreign", type=float, default=d.max_foreign,
                   help="a round is quiet when other processes used at most this share of its cores (default 0.25)")
    p.add_argument("--quiet-wait", type=float, default=d.quiet_wait_s,
                   help="seconds to wait before each run for the cores to be quiet (0: do not wait)")


def run_from_args(args: argparse.Namespace) -> int:
    """CLI body: configure, run, print the Markdown table, write JSON/PNG. Returns the exit code."""
    try:
        named = {f.name for f in fields(BenchConfig)} - {"trainer_cpus", "data_cpus"}  # options of the same name
        cfg = BenchConfig(parse_cpu_list(args.trainer_cpus), parse_cpu_list(args.data_cpus) if args.data_cpus else [],
                          local_server=not args.no_local_server, timeout_s=args.timeout, quiet_wait_s=args.quiet_wait,
                          **{k: v for k, v in vars(args).items() if k in named})
        if not cfg.data_cpus:
            raise ValueError("no data CPUs: this machine offers one CPU; pass --trainer-cpus and --data-cpus")
        summary = run_benchmark(cfg, echo=lambda line: print(line, flush=True))
    except ValueError as exc:
        print(f"benchmark: {exc}")
        return 2
    print(report.markdown(summary))
    for line in boundary_lines(summary["runs"]):
        print(line)
    if "consumer_cpu" in summary:
        from .consumer_cpu import report as consumer_cpu_report

        print(consumer_cpu_report(summary["consumer_cpu"]))
    if args.json:
        report.write_json(args.json, summary)
        print(f"\nall figures: {args.json}")
    if args.png:
        report.write_png(args.png, summary)
        print(f"chart: {args.png}")
    failed = sum(m["failed_runs"] for m in summary["modes_all_rounds"].values())
    return 1 if failed or summary["speedup"] is None else 0
