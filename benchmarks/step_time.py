"""Step time, data wait and $ cost of the same job, homogeneous vs heterogeneous, on this machine.

``python -m benchmarks.step_time`` (also ``hetero bench``) runs the MNIST job of
``hetero local`` in two layouts, with CPU affinity so each gets exactly the cores it should:

* **homogeneous**: the trainer and its DataLoader workers on the K *trainer CPUs* (a GPU
  instance's few vCPUs preprocessing for it);
* **heterogeneous**: the same trainer on the same K CPUs (also serving batches from them,
  ``dnn_local_server=true``, unless ``--no-local-server``) plus data node(s) on the M *data CPUs*.

Modes alternate (homo, hetero, hetero, homo, ...) over ``--repeats`` rounds so drift in the
machine's load hits both; figures are medians over rounds, with the min-max spread, and the
speed-up is also given per round (both runs of a round measured back to back). The first
``--warmup`` steps of every run are discarded. With no GPU here the accelerator step is
*emulated* (``--emulate-step-s``: the trainer sleeps instead of computing; 0 = the real CPU
step), so the trainer's own CPU work does not hide the data path. Each emulated node is
priced as the instance type named on the command line (benchmarks/cost.py), and the
planner's prediction (benchmarks/planner.py) from a one-core profile is printed beside the
measured step times.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import bench_report
from ._cpu_monitor import NodeCpuMonitor, cpu_list_text, foreign_share, parse_cpu_list, wait_for_quiet
from .bench_summary import MODES, add_costs, add_prediction, summarize
from .cost import PriceError, load_prices
from .planner import PlanError
from .profile import profile_pipeline

log = logging.getLogger(__name__)
PIPELINE = "examples.mnist:build_pipeline"
IMAGES_PIPELINE = "examples.imagefolder:build_pipeline"  # --workload images: JPEG decode + crop + flip
_WINDOW = re.compile(r"step (\d+): avg step time ([\d.]+) s over the last (\d+) steps")


@dataclass
class BenchConfig:
    """What to run; see ``python -m benchmarks.step_time --help`` for each field."""

    trainer_cpus: list[int]
    data_cpus: list[int]
    repeats: int = 3
    steps: int = 150
    warmup: int = 10
    batch_size: int = 64
    augment_repeats: int = 4
    emulate_step_s: float = 0.05
    loader_workers: int = 0            # 0: one per trainer CPU
    local_server: bool = True
    data_nodes: int = 1
    synth_train: int = 0               # 0: enough for every step in one epoch
    profile_batches: int = 8
    dnn_instance: str = "ml.p3.2xlarge"
    data_instance: str = "ml.c5.9xlarge"
    epoch_samples: int = 60000
    prices: str | None = None
    output: Path = Path("out/bench")
    timeout_s: float = 900.0
    max_foreign: float = 0.25          # a round is quiet when others used at most this share of its cores
    quiet_wait_s: float = 120.0        # before each run, wait up to this long for the cores to be quiet
    workload: str = "mnist"            # "mnist" (blur loop) or "images" (JPEG image folder, ResNet-style crops)

    def check(self) -> None:
        """Raises ValueError naming the bad value and what it must be."""
        overlap = set(self.trainer_cpus) & set(self.data_cpus)
        if overlap:
            raise ValueError(f"--trainer-cpus and --data-cpus share CPUs {sorted(overlap)}; give them disjoint sets")
        for name in ("repeats", "steps", "batch_size", "data_nodes", "profile_batches", "epoch_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"--warmup {self.warmup} must be >= 0 and below --steps {self.steps}")
        if self.synth_train and self.synth_train < self.steps * self.batch_size:
            raise ValueError(f"--synth-train {self.synth_train} holds fewer than --steps x --batch-size = "
                             f"{self.steps * self.batch_size} images; raise it or pass 0 (auto)")
        if not 0 < self.max_foreign <= 1 or self.quiet_wait_s < 0:
            raise ValueError(f"--max-foreign {self.max_foreign} must be in (0, 1] and --quiet-wait "
                             f"{self.quiet_wait_s} >= 0")
        if self.workload not in ("mnist", "images"):
            raise ValueError(f"--workload {self.workload!r} must be 'mnist' or 'images'")
        if self.emulate_step_s < 0 or self.augment_repeats < 0 or self.loader_workers < 0:
            raise ValueError("--emulate-step-s, --augment-repeats and --loader-workers must be >= 0")

    @property
    def pipeline(self) -> str:
        return IMAGES_PIPELINE if self.workload == "images" else PIPELINE

    def pipeline_options(self) -> dict:
        if self.workload == "images":
            return {"batch_size": self.batch_size}
        return {"batch_size": self.batch_size, "augment_repeats": self.augment_repeats}

    def hyperparameters(self) -> dict:
        return {"max_steps": self.steps, "warmup_steps": self.warmup, "emulate_step_s": self.emulate_step_s,
                "pipeline": self.pipeline, **{f"pipeline.{k}": v for k, v in self.pipeline_options().items()},
                "loader_workers": self.loader_workers or len(self.trainer_cpus),
                "log_every": max(5, self.steps // 10), "evaluate": ""}


@dataclass
class RunResult:
    """One run of one mode."""

    mode: str
    round: int
    ok: bool
    wall_s: float
    metrics: dict | None
    cpu: list[dict] = field(default_factory=list)
    core_busy: dict = field(default_factory=dict)
    windows_s: list[float] = field(default_factory=list)  # per log window after warm-up
    foreign_share: float | None = None    # share of the run's cores used by other processes
    quiet_wait_s: float = 0.0             # waited before the run for the cores to be quiet
    busy_before: float | None = None      # the cores' busy share (others) just before the run

    @property
    def step_s(self) -> float | None:
        return (self.metrics or {}).get("avg_step_time_s")


def step_windows(log_path: Path, warmup: int) -> list[float]:
    """Average step time of each logged window that lies wholly after the warm-up steps."""
    if not log_path.is_file():
        return []
    out = []
    for m in _WINDOW.finditer(log_path.read_text(errors="replace")):
        last, avg, n = int(m.group(1)), float(m.group(2)), int(m.group(3))
        if last - n >= warmup:
            out.append(avg)
    return out


def run_mode(cfg: BenchConfig, mode: str, round_no: int, data_dir: Path) -> RunResult:
    """Run the job once in ``mode`` with every node pinned; sample each node's CPU use."""
    from hetero.local import LocalJob, run_local

    hps = cfg.hyperparameters()
    homo = mode == "homogeneous"
    if not homo:
        hps["dnn_local_server"] = cfg.local_server
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
    log.info("round %d: %s run %s: avg step %s s, other processes used %s of CPUs %s", round_no, mode,
             "ok" if result.ok else "FAILED", (result.metrics or {}).get("avg_step_time_s"),
             "n/a" if foreign is None else f"{foreign:.0%}", cpus)
    return RunResult(mode, round_no, result.ok, wall, result.metrics, nodes, monitor.core_busy,
                     step_windows(out / "logs" / "algo-1.log", cfg.warmup), foreign, waited, before)


def run_benchmark(cfg: BenchConfig) -> dict:
    """Profile, run both modes ``cfg.repeats`` times (alternating), and return every figure.

    Raises:
        PriceError: unknown instance type (before anything runs). ValueError: bad configuration.
    """
    from examples.mnist import write_synthetic

    cfg.check()
    table = load_prices(cfg.prices)
    table.info(cfg.dnn_instance), table.info(cfg.data_instance)  # fail now, not after the runs
    cfg.output.mkdir(parents=True, exist_ok=True)
    data_dir = cfg.output / "data"
    images = cfg.synth_train or (cfg.steps + 1) * cfg.batch_size
    if cfg.workload == "images":
        data_dir = cfg.output / "images"
        _image_folder(data_dir, images)
    else:
        write_synthetic(data_dir, images, 0, seed=0)
    options = {**cfg.pipeline_options(), "data_dir": str(data_dir.resolve())}

    def profile():
        if cfg.quiet_wait_s:
            wait_for_quiet(cfg.data_cpus[:1], cfg.max_foreign, cfg.quiet_wait_s)
        return profile_pipeline(cfg.pipeline, options, batches=cfg.profile_batches, cpu=cfg.data_cpus[0])

    profiles = [profile()]
    started = time.time()
    runs = []
    for i in range(cfg.repeats):
        for mode in (MODES if i % 2 == 0 else MODES[::-1]):
            runs.append(run_mode(cfg, mode, i, data_dir))
    profiles.append(profile())
    # Other processes only ever slow a profile down: the faster of the two is the better estimate.
    prof = min(profiles, key=lambda p: p.median_s)
    summary = summarize(cfg, runs)
    add_costs(cfg, summary, table)
    add_prediction(cfg, summary, prof.median_s)
    summary.update(config={**asdict(cfg), "output": str(cfg.output)}, profile=asdict(prof),
                   profiles=[asdict(p) for p in profiles], runs=[asdict(r) for r in runs], started_unix=started,
                   machine=_machine())
    return summary


def _image_folder(folder: Path, images: int, classes: int = 4) -> None:
    """A JPEG folder of drawn shapes with at least ``images`` files (kept for the next run)."""
    from examples.imagesynth import write_image_folder

    per_class = -(-images // classes)
    if len(list(folder.glob("*/*.jpg"))) != per_class * classes:
        write_image_folder(folder, per_class=per_class, classes=classes, threads=len(os.sched_getaffinity(0)))


def _machine() -> dict:
    import platform

    return {"cpus_usable": sorted(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
            "load_avg_1m_at_end": os.getloadavg()[0], "python": platform.python_version(),
            "node": platform.node()}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's options (shared by ``python -m benchmarks.step_time`` and ``hetero bench``)."""
    usable = sorted(os.sched_getaffinity(0))
    d = BenchConfig(usable[:1], usable[1:])
    p.add_argument("--trainer-cpus", default=cpu_list_text(usable[:1]), help="K CPUs of the trainer node (default: first)")
    p.add_argument("--data-cpus", default=cpu_list_text(usable[1:]), help="M CPUs of the data node(s) (default: the rest)")
    p.add_argument("--repeats", type=int, default=d.repeats, help="rounds; each runs both modes")
    p.add_argument("--steps", type=int, default=d.steps, help="steps per run")
    p.add_argument("--warmup", type=int, default=d.warmup, help="steps discarded from each run's averages")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--augment-repeats", type=int, default=d.augment_repeats, help="MNIST blur passes (CPU cost)")
    p.add_argument("--emulate-step-s", type=float, default=d.emulate_step_s,
                   help="EMULATED accelerator step in seconds (sleep); 0 = real CPU step")
    p.add_argument("--loader-workers", type=int, default=0, help="trainer DataLoader workers (0: one per trainer CPU)")
    p.add_argument("--no-local-server", action="store_true", help="trainer CPUs do not build batches in hetero mode")
    p.add_argument("--data-nodes", type=int, default=d.data_nodes, help="emulated data nodes, all on --data-cpus")
    p.add_argument("--synth-train", type=int, default=d.synth_train, help="synthetic images (0: steps x batch)")
    p.add_argument("--workload", choices=("mnist", "images"), default=d.workload,
                   help="mnist: the MNIST job (blur loop, --augment-repeats); images: a JPEG image folder "
                        "(examples.imagefolder: decode, RandomResizedCrop(224), flip)")
    p.add_argument("--dnn-instance", default=d.dnn_instance, help="instance type the trainer node stands for")
    p.add_argument("--data-instance", default=d.data_instance, help="instance type each data node stands for")
    p.add_argument("--epoch-samples", type=int, default=d.epoch_samples, help="samples per epoch for $/epoch (MNIST: 60000)")
    p.add_argument("--prices", default=None, help="price file merged over benchmarks/prices.json")
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
        cfg = BenchConfig(parse_cpu_list(args.trainer_cpus), parse_cpu_list(args.data_cpus) if args.data_cpus else [],
                          repeats=args.repeats, steps=args.steps, warmup=args.warmup, batch_size=args.batch_size,
                          augment_repeats=args.augment_repeats, emulate_step_s=args.emulate_step_s,
                          loader_workers=args.loader_workers, local_server=not args.no_local_server,
                          data_nodes=args.data_nodes, synth_train=args.synth_train, dnn_instance=args.dnn_instance,
                          data_instance=args.data_instance, epoch_samples=args.epoch_samples, prices=args.prices,
                          output=args.output, timeout_s=args.timeout, max_foreign=args.max_foreign,
                          quiet_wait_s=args.quiet_wait, workload=args.workload)
        if not cfg.data_cpus:
            raise ValueError("no data CPUs: this machine offers one CPU; pass --trainer-cpus and --data-cpus")
        summary = run_benchmark(cfg)
    except (PriceError, PlanError, ValueError) as exc:
        print(f"benchmark: {exc}")
        return 2
    print(bench_report.markdown(summary))
    if args.json:
        bench_report.write_json(args.json, summary)
        print(f"\nall figures: {args.json}")
    if args.png:
        bench_report.write_png(args.png, summary)
        print(f"chart: {args.png}")
    failed = sum(m["failed_runs"] for m in summary["modes_all_rounds"].values())
    return 1 if failed or summary["speedup"] is None else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.step_time [options]``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_time", description=__doc__.split("\n\n")[0])
    p.add_argument("--log-level", default=os.environ.get("HETERO_LOG_LEVEL", "INFO"))
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s bench %(levelname)s %(name)s: %(message)s")
    return run_from_args(args)


if __name__ == "__main__":
    raise SystemExit(main())
