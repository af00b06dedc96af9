"""The launcher's options in sections, one frozen dataclass each: every field is the hyperparameter
of the same name (``hetero local --hp epochs=3``, ``Estimator(hyperparameters={"epochs": 3})``),
and each section checks its own fields. ``LaunchConfig`` (launcher/config/launch_config.py)
composes them; docs/launcher.md gives each option's meaning.
"""
from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass, field
from typing import Any

from data_service.errors import ConfigError

EVALUATE_AUTO = "auto"  # evaluate=auto: the evaluate function of the model's module, when it has one
IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DDP_BACKENDS = ("auto", "nccl", "gloo", "smddp")  # dnn_worker.device.ddp.BACKENDS
OPTIMIZERS = {"adadelta": "torch.optim:Adadelta", "sgd": "torch.optim:SGD", "adam": "torch.optim:Adam",
              "adamw": "torch.optim:AdamW"}


def _within(section: object, names: tuple[str, ...], low: int, high: float = math.inf, must: str = "") -> None:
    for name in names:
        if not low <= getattr(section, name) <= high:
            raise ConfigError(f"{name}={getattr(section, name)} must be {must or f'>= {low}'}")


def _seconds(section: object, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(section, name) <= 0:
            raise ConfigError(f"{name}={getattr(section, name)} must be > 0 seconds")


# A number of bytes, given in a hyperparameter as a size ("8GB", "512MiB") or an integer: parsed
# once where the hyperparameters are read (launch_config._coerce), an int from then on.
ByteSize = int

@dataclass(frozen=True)
class RolesSection:
    """Which instance groups play which role."""

    data_group: str = "data_group"          # comma-separated names allowed
    dnn_group: str = "dnn_group"
    homogeneous: bool = False

    def group_list(self, which: str) -> list[str]:
        """``data_group`` / ``dnn_group`` as a list of names."""
        return [g.strip() for g in getattr(self, which).split(",") if g.strip()]

    def check(self) -> None:
        for name in ("data_group", "dnn_group"):
            if not self.group_list(name):
                raise ConfigError(f"{name}={getattr(self, name)!r} must name at least one instance group")


@dataclass(frozen=True)
class DataSection:
    """The pipeline (built by data servers, or by the node itself in homogeneous mode) and how its
    batches reach the trainers."""

    pipeline: str = "examples.mnist:build_pipeline"
    pipeline_options: dict[str, Any] = field(default_factory=dict, hash=False)
    loader_workers: int = -1                # -1: 2 in homogeneous mode, 0 in heterogeneous (see workers_for)
    homogeneous_loader: str = "server"      # homogeneous mode: "server" (the node's own data server, the
                                            # data nodes' code) or "dataloader" (LocalDataset in DataLoader workers)

    def homogeneous_server_workers(self, nprocs: int) -> int:
        """Worker processes of a homogeneous node's own data server (0: none, DataLoader workers build).

        With ``homogeneous_loader="server"`` (the default) a homogeneous node builds its batches
        the way a data node does, in a data server's worker processes on its own CPUs, and its
        ranks take them through shared memory: a batch costs the same CPU in either mode, so the
        speed-up a heterogeneous job shows is the data nodes' cores, not a cheaper code path.
        ``loader_workers`` per rank (default 2) set the count; 0 builds in the trainer itself.
        """
        if self.homogeneous_loader != "server" or self.loader_workers == 0:
            return 0
        return (self.loader_workers if self.loader_workers > 0 else 2) * max(1, nprocs)

    def workers_for(self, mode: str) -> int:
        """DataLoader workers per rank in ``mode`` ("homogeneous" or "heterogeneous").

        ``loader_workers=-1`` (the default) picks 2 in homogeneous mode, where the workers build
        the batches, and 0 in heterogeneous mode, where batches arrive built: a worker process
        would only add a copy of every batch and a process on the GPU node's CPUs, the ones the
        data nodes exist to spare.
        """
        if mode == "homogeneous" and self.homogeneous_server_workers(1):
            return 0  # the node's own data server builds the batches
        if self.loader_workers >= 0:
            return self.loader_workers
        return 2 if mode == "homogeneous" else 0

    def check(self) -> None:
        if self.pipeline.count(":") != 1:
            raise ConfigError(f"pipeline={self.pipeline!r} must look like 'package.module:function'")
        if self.loader_workers < -1:
            raise ConfigError(f"loader_workers={self.loader_workers} must be >= 0, or -1 for the mode's default")
        if self.homogeneous_loader not in ("server", "dataloader"):
            raise ConfigError(f"homogeneous_loader={self.homogeneous_loader!r} must be 'server' (the node's own data "
                              "server builds batches) or 'dataloader' (DataLoader workers build them)")


@dataclass(frozen=True)
class ServeSection:
    """A data node's server, and the server a DNN host may run beside its trainers."""

    data_port: int = 6000
    bulk_port: int = 0
    bind_host: str = "0.0.0.0"
    data_workers: int = 0                   # 0: one per usable CPU
    watchdog_connect_s: float = 1800.0      # exit non-zero if no consumer came within this
    watchdog_idle_s: float = 600.0          # ... or all consumers have been gone this long
    dnn_local_server: bool = False          # DNN hosts also serve batches from their own CPUs
    local_server_nice: int = 10             # nice value of a DNN host's own data server's workers (0-19):
                                            # they build in the cycles its trainers leave
    batch_window: ByteSize = 0              # bytes (given as a size, e.g. 8GB): a data node keeps built batches
                                            # for every job that asks: a sweep's jobs of one seed (docs/sweep.md)

    def check(self) -> None:
        _within(self, ("data_port", "bulk_port"), 0, 65535, "a TCP port 0..65535")
        _within(self, ("data_workers",), 0)
        _seconds(self, ("watchdog_connect_s", "watchdog_idle_s"))
        _within(self, ("local_server_nice",), 0, 19, "0..19 (0: the trainers' own priority)")
        if not self.bind_host:
            raise ConfigError("bind_host='' must be an address to listen on, e.g. 0.0.0.0")
        if self.batch_window < 0:
            raise ConfigError(f"batch_window={self.batch_window} must be >= 0 bytes (0: no window)")


@dataclass(frozen=True)
class ElasticSection:
    """Servers that join and leave (docs/elastic.md)."""

    registry: str = ""                      # this job's registry (folder or s3://bucket/prefix): consumers
                                            # use every server registered there; data nodes register there
    join: str = ""                          # a data-only job: its data nodes join this registry of another job
    advertise_host: str = ""                # host/IP consumers dial for this node's registry entry

    def check(self) -> None:
        if self.registry and self.join:
            raise ConfigError(f"registry={self.registry!r} and join={self.join!r}: registry is this job's own registry, "
                              "join makes a data-only job serve another job's; set one of them")
        from data_service.membership.registry import check_uri

        for name in ("registry", "join"):
            if getattr(self, name):
                check_uri(getattr(self, name), name)


@dataclass(frozen=True)
class DnnSection:
    """A DNN node: its wait for the data servers, its ranks and their process group."""

    data_wait_s: float = 600.0              # deadline for every data server to be healthy
    master_port: int = 29500
    procs_per_node: int = 0                 # 0: one per GPU, or 1 without GPUs
    dist_timeout_s: float = 600.0
    ddp_backend: str = "auto"               # auto (nccl with CUDA, else gloo), nccl, gloo or smddp
    train_timeout_s: float = 86400.0
    connect_timeout_s: float = 60.0

    def check(self) -> None:
        _within(self, ("master_port",), 0, 65535, "a TCP port 0..65535")
        _within(self, ("procs_per_node",), 0)
        _seconds(self, ("data_wait_s", "dist_timeout_s", "train_timeout_s", "connect_timeout_s"))
        if self.ddp_backend not in DDP_BACKENDS:  # what this machine can run is checked at start (preflight)
            raise ConfigError(f"ddp_backend={self.ddp_backend!r} must be one of {', '.join(DDP_BACKENDS)} "
                              "(auto: nccl with CUDA, else gloo)")


@dataclass(frozen=True)
class ModelSection:
    """The user's training code, by import path, and its optimizer."""

    model: str = "examples.mnist:Net"
    model_options: dict[str, Any] = field(default_factory=dict, hash=False)
    step: str = "examples.mnist:train_step"
    evaluate: str = "auto"                  # auto: the model's module's ``evaluate``, if any; "" disables
    optimizer: str = "adadelta"
    lr: float = 1.0

    def optimizer_path(self) -> str:
        """The optimizer's import path: a known name's (``adadelta``, ``sgd``, ``adam``, ``adamw``) or as given."""
        return OPTIMIZERS.get(self.optimizer.lower(), self.optimizer)

    def evaluate_path(self) -> str:
        """The evaluation's import path; "" for none. ``auto`` is the model's module's ``evaluate``
        when that module has a callable one (``examples.imagefolder:evaluate`` for
        ``examples.imagefolder:resnet18``), else none."""
        if self.evaluate != EVALUATE_AUTO:
            return self.evaluate
        module_name = self.model.partition(":")[0]
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return ""  # the model's own import fails at the preflight, naming it
        return f"{module_name}:evaluate" if callable(getattr(module, "evaluate", None)) else ""

    def check(self) -> None:
        for name in ("model", "step", "evaluate"):
            value = getattr(self, name)
            if name == "evaluate" and value in ("", EVALUATE_AUTO):
                continue
            if not IMPORT_PATH.fullmatch(value):
                empty = (f" (or empty to disable evaluation, or {EVALUATE_AUTO} for the model's module's own)"
                         if name == "evaluate" else "")
                raise ConfigError(f"{name}={value!r} must look like 'package.module:name'{empty}")
        if not (IMPORT_PATH.fullmatch(self.optimizer) or self.optimizer.isidentifier()):
            raise ConfigError(f"optimizer={self.optimizer!r} must be a name (adadelta, sgd, adam, adamw) or an "
                              "import path such as 'torch.optim:AdamW'")
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ConfigError(f"lr={self.lr} must be a number > 0")


@dataclass(frozen=True)
class TrainSection:
    """The training run: how long, its seed, what it logs and keeps."""

    epochs: int = 1
    seed: int = 0
    max_steps: int = 0                      # 0: no cap (steps per rank, all epochs)
    log_every: int = 50
    warmup_steps: int = 5                   # discarded from averages
    tensorboard: bool = False
    audit_path: str = ""

    def check(self) -> None:
        _within(self, ("epochs", "log_every"), 1)
        _within(self, ("max_steps", "warmup_steps", "seed"), 0)


@dataclass(frozen=True)
class EmulateSection:
    """An emulated accelerator step: a sleep instead of the model's step (no GPU needed)."""

    emulate_step_s: float = 0.0             # >0: sleep instead of a real step (reported as emulated)
    emulate_step_schedule: str = ""         # "STEP:SECONDS,...": from step STEP on, the emulated step lasts SECONDS

    def step_schedule(self) -> list[tuple[int, float]]:
        """``emulate_step_schedule`` as (first step, seconds) pairs by step. Raises ConfigError."""
        out = []
        for part in filter(None, (p.strip() for p in self.emulate_step_schedule.split(","))):
            step, _, seconds = part.partition(":")
            try:
                pair = (int(step), float(seconds))
            except ValueError:
                pair = (-1, -1.0)
            if pair[0] < 0 or not (math.isfinite(pair[1]) and pair[1] > 0):
                raise ConfigError(f"emulate_step_schedule={self.emulate_step_schedule!r}: {part!r} must be "
                                  "STEP:SECONDS with STEP >= 0 and SECONDS > 0, e.g. '0:0.05,2000:0.01'")
            out.append(pair)
        if out and self.emulate_step_s <= 0:
            raise ConfigError("emulate_step_schedule needs emulate_step_s > 0 (the step before the first entry)")
        return sorted(out)

    def emulated_step_s(self, step: int) -> float:
        """The emulated step's length at ``step`` (steps done so far): ``emulate_step_s`` until the
        schedule's first entry, then each entry's from its step on."""
        seconds = self.emulate_step_s
        for first, value in self.step_schedule() if self.emulate_step_schedule else ():
            if step >= first:
                seconds = value
        return seconds

    def check(self) -> None:
        if self.emulate_step_s < 0:
            raise ConfigError(f"emulate_step_s={self.emulate_step_s} must be >= 0 (0 = a real step)")
        if not math.isfinite(self.emulate_step_s):
            raise ConfigError(f"emulate_step_s={self.emulate_step_s} must be a finite number of seconds")
        self.step_schedule()


@dataclass(frozen=True)
class AdviceSection:
    """Rank 0's live advice (data nodes to add or drop, every N steps and at the end) and the
    autoscaler acting on it (``autoscale.*``, launcher/autoscale/settings.py)."""

    advice_every: int = 200                 # 0: no advice
    advice_prices: dict[str, float] = field(default_factory=dict, hash=False)  # instance type -> $/h, for the costs
    advice_network: dict[str, float] = field(default_factory=dict, hash=False)  # instance type -> NIC baseline Gbps
    advice_flow_gbps: float = 5.0           # one flow's cap: 5 Gbps, 10 in a cluster placement group; 0: none
    autoscale_options: dict[str, Any] = field(default_factory=dict, hash=False)  # autoscale.mode=act, ...

    def check(self) -> None:
        _within(self, ("advice_every",), 0)
        bad = {k: v for k, v in self.advice_prices.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0}
        if bad:
            raise ConfigError(f"advice_prices={self.advice_prices!r}: {bad} must be $/h numbers >= 0, e.g. "
                              "'{\"ml.c5.9xlarge\": 1.836}'")
        bad = {k: v for k, v in self.advice_network.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0}
        if bad:
            raise ConfigError(f"advice_network={self.advice_network!r}: {bad} must be NIC baselines in Gbps > 0, "
                              "e.g. '{\"ml.c5.9xlarge\": 12}'")
        if not math.isfinite(self.advice_flow_gbps) or self.advice_flow_gbps < 0:
            raise ConfigError(f"advice_flow_gbps={self.advice_flow_gbps} must be >= 0 Gbps (0: no per-flow cap)")


@dataclass(frozen=True)
class CheckpointSection:
    """Checkpoints (SIGTERM, periodic, end of training) and resume."""

    checkpoint: bool = True                 # false: never write or read checkpoints
    checkpoint_dir: str = ""                # "": the node's (HETERO_CHECKPOINT_DIR, else /opt/ml/checkpoints)
    checkpoint_every: int = 0               # also checkpoint every N steps (0: only on SIGTERM and at the end)

    def check(self) -> None:
        _within(self, ("checkpoint_every",), 0)


@dataclass(frozen=True)
class JobSection:
    """The job itself: its secret, its name where SageMaker gives none, its log level."""

    job_secret: str = ""                    # prefer the HETERO_JOB_SECRET variable
    job_name: str = ""                      # when TRAINING_JOB_NAME is not set
    log_level: str = "INFO"

    def check(self) -> None:
        if str(self.log_level).upper() not in LOG_LEVELS:
            raise ConfigError(f"log_level={self.log_level!r} must be one of {', '.join(LOG_LEVELS)}")
