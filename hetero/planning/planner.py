"""Plan a heterogeneous cluster: the cheapest data group that keeps the accelerators fed.

The model (a steady-state pipeline, preprocessing overlapped with the accelerator step):

* every accelerator (GPU) consumes one batch per step, so a step of ``G`` accelerators needs
  ``G`` batches; one batch costs ``preprocess_s`` seconds of one CPU core;
* ``C`` cores working in parallel (at ``efficiency``, 1.0 = perfect scaling) build those
  batches in ``data_s = G * preprocess_s / (C * efficiency)`` seconds;
* step time ``= max(gpu_step_s, data_s)`` (``gpu_step_s``: the step with the data already
  resident in accelerator memory), data wait ``= (step - gpu_step_s) / step``.

Homogeneous: the GPU instances' own vCPUs preprocess, minus ``reserve_cpus`` per GPU for the
trainer process. Heterogeneous: ``count`` data instances' vCPUs (plus the GPU instances' own
ones with ``local_server``, as the launcher's ``dnn_local_server=true`` does). One vCPU is
taken to equal one core of the machine ``preprocess_s`` was measured on; SageMaker bills
every instance for the whole job, so ``$/step = cluster $/h * step / 3600``.
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field

from .cost import Cluster, PriceError, PriceTable

log = logging.getLogger(__name__)


class PlanError(ValueError):
    """A figure the planner cannot work with (naming the value and what it should be)."""


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PlanError(f"{name} must be a positive number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Prediction:
    """Predicted steady-state step of one cluster layout."""

    step_s: float
    data_s: float
    data_wait_fraction: float
    bound: str  # "gpu" or "data"


def predict_step(preprocess_s: float, gpu_step_s: float, cores: float, consumers: int = 1,
                 efficiency: float = 1.0, trainer_s: float = 0.0) -> Prediction:
    """Step time when ``cores`` CPU cores feed ``consumers`` accelerators.

    Args:
        preprocess_s: seconds one core needs to build one batch.
        gpu_step_s: accelerator step time with the batch already resident (or the emulated step).
        cores: cores building batches in parallel.
        consumers: accelerators, each taking one batch per step.
        efficiency: share of ideal parallel scaling the data path reaches (0 < e <= 1).
        trainer_s: CPU seconds the trainer itself spends per batch on those same cores (the
            finish stage where training runs on the CPU, as with an emulated step here; about 0
            on a GPU, where the finish stage runs on the device). Cores that both build batches
            and train, as a homogeneous node's or a heterogeneous trainer node with its own data
            server, share the two kinds of work.

    Returns:
        The predicted step time, data time per step, data wait share and what bounds the step.
    """
    _positive("preprocess_s", preprocess_s)
    _positive("gpu_step_s", gpu_step_s)
    _positive("cores", cores)
    if not 0 < efficiency <= 1:
        raise PlanError(f"efficiency must be in (0, 1], got {efficiency!r}")
    if not isinstance(consumers, int) or consumers < 1:
        raise PlanError(f"consumers must be an integer >= 1, got {consumers!r}")
    if not trainer_s >= 0:
        raise PlanError(f"trainer_s must be >= 0 seconds, got {trainer_s!r}")
    data_s = consumers * (preprocess_s + trainer_s) / (cores * efficiency)
    step_s = max(gpu_step_s, data_s)
    return Prediction(step_s, data_s, (step_s - gpu_step_s) / step_s, "data" if data_s > gpu_step_s else "gpu")


@dataclass(frozen=True)
class Option:
    """One cluster layout with its predicted step and cost."""

    label: str
    cluster: tuple[tuple[str, int], ...]
    data_instance: str | None
    data_count: int
    cores: float
    step_s: float
    data_wait_fraction: float
    usd_per_hour: float
    usd_per_step: float
    usd_per_1000_steps: float
    usd_per_epoch: float | None
    meets_target: bool


@dataclass
class Plan:
    """The planner's answer: the homogeneous alternative, each data type's best, the choice."""

    workload: dict
    homogeneous: Option
    candidates: list[Option] = field(default_factory=list)
    recommended: Option | None = None

    def to_dict(self) -> dict:
        return {"workload": self.workload, "homogeneous": asdict(self.homogeneous),
                "candidates": [asdict(c) for c in self.candidates],
                "recommended": asdict(self.recommended) if self.recommended else None}


def _option(table: PriceTable, label: str, cluster: Cluster, data_instance: str | None, data_count: int,
            cores: float, pred: Prediction, target: float, steps_per_epoch: int | None) -> Option:
    hourly = table.cluster_hourly(cluster)
    per_step = table.cost_per_step(cluster, pred.step_s)
    return Option(label, tuple(tuple(c) for c in cluster), data_instance, data_count, cores, pred.step_s,
                  pred.data_wait_fraction, hourly, per_step, 1000 * per_step,
                  steps_per_epoch * per_step if steps_per_epoch else None,
                  pred.data_wait_fraction <= target + 1e-12)


def plan(table: PriceTable, dnn_instance: str, preprocess_s: float, gpu_step_s: float, batch_size: int,
         dnn_count: int = 1, data_types: list[str] | None = None, max_count: int = 16,
         target_wait: float = 0.05, reserve_cpus: int = 1, efficiency: float = 1.0,
         local_server: bool = False, epoch_samples: int = 0) -> Plan:
    """Cheapest data group (type and count) keeping data wait <= ``target_wait``, and the alternatives.

    Args:
        table: prices (hetero.planning.cost.load_prices()).
        dnn_instance: GPU instance type; ``dnn_count`` of them.
        preprocess_s: seconds one core needs per batch. gpu_step_s: step with resident data.
        batch_size: samples per batch (per accelerator).
        data_types: CPU instance types to consider (default: every type without GPUs).
        max_count: most data instances of one type to consider.
        target_wait: highest acceptable data-wait share of step time (0.05 = 5%).
        reserve_cpus: vCPUs per GPU kept for the trainer process (not preprocessing).
        efficiency: data-path scaling efficiency (see :func:`predict_step`).
        local_server: the GPU instances' own spare vCPUs also build batches.
        epoch_samples: samples per epoch, for $/epoch (0: not reported).

    Raises:
        PriceError: unknown instance type (listing the known ones). PlanError: bad figure.
    """
    if not 0 <= target_wait < 1:
        raise PlanError(f"target_wait must be a share in [0, 1), e.g. 0.05 for 5%, got {target_wait!r}")
    for name, value in (("batch_size", batch_size), ("dnn_count", dnn_count), ("max_count", max_count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{name} must be an integer >= 1, got {value!r}")
    if reserve_cpus < 0:
        raise PlanError(f"reserve_cpus must be >= 0, got {reserve_cpus!r}")
    dnn = table.info(dnn_instance)
    if dnn.gpus < 1:
        log.warning("%s has no GPU in the price table; planning as if it had one accelerator", dnn_instance)
    consumers = dnn_count * max(1, dnn.gpus)
    own_cores = dnn_count * max(1, dnn.vcpus - reserve_cpus * max(1, dnn.gpus))
    steps_per_epoch = epoch_samples // (batch_size * consumers) if epoch_samples else None
    if epoch_samples and not steps_per_epoch:
        raise PlanError(f"epoch_samples={epoch_samples} is less than one step ({batch_size * consumers} samples)")

    def predict(cores: float) -> Prediction:
        return predict_step(preprocess_s, gpu_step_s, cores, consumers, efficiency)

    dnn_cluster = [(dnn_instance, dnn_count)]
    homo = _option(table, "homogeneous", dnn_cluster, None, 0, own_cores, predict(own_cores), target_wait,
                   steps_per_epoch)
    types = data_types if data_types else [t for t in table.known() if table.info(t).gpus == 0]
    candidates = []
    for t in types:
        row = table.info(t)  # raises PriceError listing known types
        options = []
        for n in range(1, max_count + 1):
            cores = n * row.vcpus + (own_cores if local_server else 0)
            pred = predict(cores)
            options.append(_option(table, f"{n} x {t}", dnn_cluster + [(t, n)], t, n, cores, pred, target_wait,
                                   steps_per_epoch))
            if pred.bound == "gpu":
                break  # more instances of this type would only add cost
        # While data-bound, $/step = (dnn $/h + n * data $/h) * k / n falls as n grows, so the cheapest
        # layout that meets the target is not always the smallest one: compare them all.
        meeting = [o for o in options if o.meets_target]
        candidates.append(min(meeting, key=lambda o: (o.usd_per_step, o.data_count)) if meeting
                          else options[-1])  # none meets it: show the best this type can do
    meeting = [c for c in candidates if c.meets_target]
    recommended = min(meeting, key=lambda c: (c.usd_per_step, c.data_count)) if meeting else None
    workload = {"dnn_instance": dnn_instance, "dnn_count": dnn_count, "consumers": consumers,
                "preprocess_s": preprocess_s, "gpu_step_s": gpu_step_s, "batch_size": batch_size,
                "target_wait": target_wait, "reserve_cpus": reserve_cpus, "efficiency": efficiency,
                "local_server": local_server, "max_count": max_count, "steps_per_epoch": steps_per_epoch,
                "prices_region": table.region, "prices_as_of": table.as_of}
    return Plan(workload, homo, sorted(candidates, key=lambda c: c.usd_per_step), recommended)


def format_plan(p: Plan) -> str:
    """The plan as Markdown: inputs, one row per option, the recommendation."""
    w = p.workload
    lines = [f"Workload: {w['consumers']} accelerator(s) on {w['dnn_count']} x {w['dnn_instance']}, "
             f"batch {w['batch_size']}, preprocessing {w['preprocess_s'] * 1000:.1f} ms/batch on one core, "
             f"GPU step {w['gpu_step_s'] * 1000:.1f} ms with resident data; target data wait "
             f"<= {w['target_wait']:.0%}; prices {w['prices_region']} as of {w['prices_as_of']}.", "",
             "| layout | data cores | pred. step (s) | data wait | $/h | $/step | $/1000 steps | $/epoch | meets target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for o in [p.homogeneous] + p.candidates:
        epoch = "n/a" if o.usd_per_epoch is None else f"{o.usd_per_epoch:.4f}"
        mark = " (recommended)" if o is p.recommended else ""
        lines.append(f"| {o.label}{mark} | {o.cores:g} | {o.step_s:.4f} | {o.data_wait_fraction:.1%} | "
                     f"{o.usd_per_hour:.3f} | {o.usd_per_step:.6f} | {o.usd_per_1000_steps:.4f} | {epoch} | "
                     f"{'yes' if o.meets_target else 'no'} |")
    lines.append("")
    if p.recommended is None:
        lines.append(f"No data group of at most {w['max_count']} instances keeps data wait under "
                     f"{w['target_wait']:.0%}; raise --max-count, relax --target-wait or make preprocessing cheaper.")
    else:
        r, h = p.recommended, p.homogeneous
        if h.meets_target and h.usd_per_step <= r.usd_per_step:
            lines.append(f"The GPU instance(s) alone already keep data wait under {w['target_wait']:.0%} and cost "
                         "less per step: a data group does not pay for this workload.")
        lines.append(f"Recommended: {r.data_count} x {r.data_instance} beside {w['dnn_count']} x "
                     f"{w['dnn_instance']}: predicted {r.step_s:.4f} s/step ({r.data_wait_fraction:.1%} data wait), "
                     f"${r.usd_per_step:.6f}/step; homogeneous {h.step_s:.4f} s/step, ${h.usd_per_step:.6f}/step "
                     f"(cost ratio homogeneous/recommended {h.usd_per_step / r.usd_per_step:.2f}).")
    return "\n".join(lines)


__all__ = ["Option", "Plan", "PlanError", "PriceError", "Prediction", "format_plan", "plan", "predict_step"]
