"""What one step-time benchmark is asked to do (:class:`BenchConfig`), what one run measured
(:class:`RunResult`) and the two modes it compares, shared by the driver (``step_time``), the
figures (``summary``) and the output (``report``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from launcher.metric_lines import JobMetrics

MODES = ("homogeneous", "heterogeneous")  # the two layouts every round runs

PIPELINE = "examples.mnist:build_pipeline"
IMAGES_PIPELINE = "data_service.pipelines.images:build_pipeline"  # --workload images: JPEG decode + crop + flip
# With no --emulate-step-s, the emulated accelerator step is this share of one core's batch, profiled in
# the same run (as the quickstart does): shorter than the batch on any machine, so one core cannot
# keep up with the "accelerator" and the homogeneous node is CPU-bound.
STEP_SHARE = 1 / 3


@dataclass
class BenchConfig:
    """What to run; see ``hetero bench --help`` for each field."""

    trainer_cpus: list[int]
    data_cpus: list[int]
    repeats: int = 3
    steps: int = 150
    warmup: int = 10
    batch_size: int = 64
    augment_repeats: int = 4
    emulate_step_s: float | None = None  # None: STEP_SHARE of the profiled batch (derived_step)
    loader_workers: int = 0            # 0: homogeneous one per trainer CPU, heterogeneous the launcher's default (0)
    local_server: bool = True
    data_nodes: int = 1
    synth_train: int = 0               # 0: enough for every step in one epoch
    epoch_batches: int = 0             # >0: epochs of this many batches (boundaries inside the run)
    log_every: int = 0                 # 0: steps // 10 (at least 5)
    consumer_cpu: bool = False         # also measure the consumer's CPU per batch (hetero/bench/consumer_cpu.py)
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
        if self.epoch_batches < 0 or self.log_every < 0:
            raise ValueError(f"--epoch-batches {self.epoch_batches} and --log-every {self.log_every} must be >= 0")
        if self.synth_train and not self.epoch_batches and self.synth_train < self.steps * self.batch_size:
            raise ValueError(f"--synth-train {self.synth_train} holds fewer than --steps x --batch-size = "
                             f"{self.steps * self.batch_size} images; raise it or pass 0 (auto)")
        if not 0 < self.max_foreign <= 1 or self.quiet_wait_s < 0:
            raise ValueError(f"--max-foreign {self.max_foreign} must be in (0, 1] and --quiet-wait "
                             f"{self.quiet_wait_s} >= 0")
        if self.workload not in ("mnist", "images"):
            raise ValueError(f"--workload {self.workload!r} must be 'mnist' or 'images'")
        if (self.emulate_step_s is not None and self.emulate_step_s < 0) or self.augment_repeats < 0 \
                or self.loader_workers < 0:
            raise ValueError("--emulate-step-s, --augment-repeats and --loader-workers must be >= 0")

    @property
    def pipeline(self) -> str:
        return IMAGES_PIPELINE if self.workload == "images" else PIPELINE

    def pipeline_options(self) -> dict:
        if self.workload == "images":
            return {"batch_size": self.batch_size}
        return {"batch_size": self.batch_size, "augment_repeats": self.augment_repeats}

    def hyperparameters(self) -> dict:
        if self.emulate_step_s is None:
            raise ValueError("emulate_step_s is not set yet: run_benchmark derives it from the profile")
        hps = {"max_steps": self.steps, "warmup_steps": self.warmup, "emulate_step_s": self.emulate_step_s,
               "pipeline": self.pipeline, **{f"pipeline.{k}": v for k, v in self.pipeline_options().items()},
               "loader_workers": self.loader_workers or len(self.trainer_cpus),  # homogeneous; run_mode sets heterogeneous
               "log_every": self.log_every or max(5, self.steps // 10), "evaluate": ""}
        if self.epoch_batches:
            hps["epochs"] = -(-self.steps // self.epoch_batches) + 1
        return hps

    def train_images(self) -> int:
        if self.epoch_batches:
            return self.epoch_batches * self.batch_size
        return self.synth_train or (self.steps + 1) * self.batch_size


def derived_step(batch_s: float) -> float:
    """The emulated step for one core's batch of ``batch_s`` seconds: ``STEP_SHARE`` of it, to 0.1 ms
    (at least 0.1 ms: 0 would mean the real CPU step)."""
    return max(1e-4, round(batch_s * STEP_SHARE, 4))


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
    boundaries: list[dict] = field(default_factory=list)  # epoch boundaries: their window vs the steady state
    cpu_per_step_s: dict = field(default_factory=dict)    # "role host" -> CPU seconds per step, steady state
    others_steady: dict = field(default_factory=dict)     # core -> share other processes used, steady state

    @cached_property
    def figures(self) -> JobMetrics | None:
        """``metrics`` (the run's metrics.json) read as the record; None without one."""
        return None if self.metrics is None else JobMetrics.from_json(self.metrics)

    @property
    def step_s(self) -> float | None:
        return None if self.figures is None else self.figures.avg_step_time_s
