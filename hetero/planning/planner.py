"""Plan a cluster: the cheapest layout, with a data group or without, that keeps the accelerators fed.

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

Given the bytes one sample takes on the wire (``bytes_per_sample``), the network bounds the
heterogeneous layouts too (:mod:`hetero.planning.network`): each data node delivers the smaller of
its cores' output and its NIC baseline, each rank's flow to a data node is capped, and the DNN
nodes' NICs bound what their ranks receive. Each layout names its binding resource: ``gpu`` (the
accelerators set the step), ``cores``, ``data NIC``, ``DNN NIC`` or ``flow``.

The recommendation is the cheapest per 1,000 images of the layouts that meet the target, the
homogeneous one included: a data group is recommended only where it pays.
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import cast

from launcher import capacity

from .cost import Cluster, InstancePrice, PriceError, PriceTable
from .network import SINGLE_FLOW_GBPS, deliverable, images_to_gbps

log = logging.getLogger(__name__)


class PlanError(ValueError):
    """A figure the planner cannot work with (naming the value and what it should be)."""


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PlanError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _share(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise PlanError(f"{name} must be in (0, 1], got {value!r}")


def _seconds(name: str, value: float, per: str = "") -> None:
    if not value >= 0:
        raise PlanError(f"{name} must be >= 0 seconds{per}, got {value!r}")


Prediction = capacity.Prediction  # step, data time, data wait, bound ("gpu" or "data") and binding


def predict_step(preprocess_s: float, gpu_step_s: float, cores: float, consumers: int = 1,
                 efficiency: float = 1.0, trainer_s: float = 0.0) -> Prediction:
    """Step time when ``cores`` CPU cores feed ``consumers`` accelerators (no network between them).

    Args:
        preprocess_s: seconds one core needs to build one batch.
        gpu_step_s: accelerator step time with the batch already resident (or the emulated step).
        cores: cores building batches in parallel.
        consumers: accelerators, each taking one batch per step.
        efficiency: share of ideal parallel scaling the data path reaches (0 < e <= 1).
        trainer_s: CPU seconds the trainer itself spends per batch on those same cores (the
            finish stage where training runs on the CPU, as with an emulated step here; about 0
            on a GPU, where the finish stage runs on the device). Cores that both build batches
            and train, as a homogeneous node's, share the two kinds of work.

    Returns:
        The predicted step time, data time per step, data wait share and what bounds the step
        (:func:`launcher.capacity.predict`: ``data_s = consumers x (preprocess_s + trainer_s) /
        (cores x efficiency)``).
    """
    _positive("preprocess_s", preprocess_s)
    _positive("gpu_step_s", gpu_step_s)
    _positive("cores", cores)
    _share("efficiency", efficiency)
    if not isinstance(consumers, int) or consumers < 1:
        raise PlanError(f"consumers must be an integer >= 1, got {consumers!r}")
    _seconds("trainer_s", trainer_s)
    own = capacity.OwnCores(cores * efficiency, preprocess_s, trainer_s, serves=True)
    return capacity.predict(capacity.Layout(consumers, gpu_step_s, own=own))


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
    binding: str = ""                 # what sets the step: gpu, cores, data NIC, DNN NIC or flow
    usd_per_1000_images: float = 0.0
    gbps_per_data_node: float | None = None  # what each data node sends at the predicted step


@dataclass
class Plan:
    """The planner's answer: the homogeneous layout, each data type's best, and the cheapest of them all
    that meets the target (``recommended``; the homogeneous layout when no data group pays)."""

    workload: dict
    homogeneous: Option
    candidates: list[Option] = field(default_factory=list)
    recommended: Option | None = None
    layouts: "Layouts | None" = field(default=None, repr=False, compare=False)  # the model the plan priced with

    @property
    def data_group(self) -> Option | None:
        """The cheapest data group that meets the target, whether or not the homogeneous layout costs less."""
        return _cheapest(self.candidates)

    def to_dict(self) -> dict:
        return {"workload": self.workload, "homogeneous": asdict(self.homogeneous),
                "candidates": [asdict(c) for c in self.candidates],
                "recommended": asdict(self.recommended) if self.recommended else None}


def predict_fed_step(preprocess_s: float, gpu_step_s: float, own_cores: float, *, data_cores: float = 0.0,
                     data_nodes: int = 1, consumers: int = 1, local_server: bool = True,
                     trainer_s: float = 0.0) -> Prediction:
    """Step time of a DNN node fed by its own cores and by ``data_nodes`` data nodes that share
    ``data_cores``, over no network (``hetero bench``: every node on this machine).

    Args:
        preprocess_s: core-seconds one batch costs to build.
        own_cores: the DNN node's cores (core-seconds per second: the cores it is pinned to, less
            what other processes take of them). Its trainers spend ``trainer_s`` of them per batch
            they take; with ``local_server`` the rest builds batches.
        data_cores: the data nodes' cores, counted alike.
    """
    _positive("preprocess_s", preprocess_s)
    _positive("gpu_step_s", gpu_step_s)
    _seconds("trainer_s", trainer_s)
    if own_cores < 0 or data_cores < 0:
        raise PlanError(f"own_cores={own_cores!r} and data_cores={data_cores!r} must be >= 0")
    nodes = capacity.uniform(data_nodes, data_cores / data_nodes / preprocess_s) if data_cores > 0 else ()
    own = capacity.OwnCores(own_cores, preprocess_s, trainer_s, serves=local_server)
    return capacity.predict(capacity.Layout(consumers, gpu_step_s, nodes, own))


def predict_network_step(preprocess_s: float, gpu_step_s: float, batch_size: int, consumers: int,
                         node_cores: float, data_nodes: int, bytes_per_sample: float | None,
                         data_nic_gbps: float | None, dnn_nic_gbps: float | None = None, dnn_nodes: int = 1,
                         flow_gbps: float | None = SINGLE_FLOW_GBPS, encode_s: float = 0.0, efficiency: float = 1.0,
                         local_cores: float = 0.0, goodput: float = 1.0) -> Prediction:
    """Step time when ``data_nodes`` data nodes of ``node_cores`` cores feed ``consumers`` ranks over the network.

    Args:
        preprocess_s: seconds one core needs to build one batch of ``batch_size`` samples.
        encode_s: seconds one core adds per sample for the wire encoding.
        bytes_per_sample: bytes one sample takes on the wire (None: the network is not modelled).
        data_nic_gbps, dnn_nic_gbps: the nodes' NIC baselines (None: not limited).
        flow_gbps: one rank's flow to one data node (None: not limited).
        local_cores: the DNN nodes' own cores building batches (``local_server``), over no NIC.
        goodput, efficiency, gpu_step_s, dnn_nodes: see :func:`hetero.planning.network.deliverable`
            and :func:`predict_step`.
    """
    _positive("preprocess_s", preprocess_s)
    _positive("gpu_step_s", gpu_step_s)
    _share("efficiency", efficiency)
    _seconds("encode_s", encode_s, per=" per sample")
    per_batch_s = preprocess_s + batch_size * encode_s
    network = None
    if bytes_per_sample is not None:
        # deliverable checks the network's figures and names a bad one as the planner always has
        deliverable(node_cores * efficiency, batch_size / per_batch_s, bytes_per_sample, data_nic_gbps,
                    data_nodes=data_nodes, consumers=consumers, dnn_nic_gbps=dnn_nic_gbps, dnn_nodes=dnn_nodes,
                    flow_gbps=flow_gbps, goodput=goodput)
        network = capacity.Network(bytes_per_sample * batch_size, data_nic_gbps, dnn_nic_gbps, flow_gbps, goodput)
    own = capacity.OwnCores(local_cores * efficiency, per_batch_s, serves=local_cores > 0)
    layout = capacity.Layout(consumers, gpu_step_s, capacity.uniform(data_nodes, node_cores * efficiency / per_batch_s),
                             own, network, dnn_nodes)
    return capacity.predict(layout)


def _check_plan(target_wait: float, batch_size: int, dnn_count: int, max_count: int, reserve_cpus: int) -> None:
    """Raise PlanError for a figure of :func:`plan` it cannot work with."""
    if not 0 <= target_wait < 1:
        raise PlanError(f"target_wait must be a share in [0, 1), e.g. 0.05 for 5%, got {target_wait!r}")
    for name, value in (("batch_size", batch_size), ("dnn_count", dnn_count), ("max_count", max_count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(reserve_cpus, bool) or not isinstance(reserve_cpus, int) or reserve_cpus < 0:
        raise PlanError(f"reserve_cpus must be an integer >= 0, got {reserve_cpus!r}")


def _own_cores(dnn_instance: str, dnn: InstancePrice, dnn_count: int, reserve_cpus: int) -> int:
    """The DNN nodes' vCPUs left to build batches once ``reserve_cpus`` per GPU go to the trainers."""
    reserved = reserve_cpus * max(1, dnn.gpus)
    if dnn.vcpus and reserved >= dnn.vcpus:
        # clamping would plan a node whose trainers hold every vCPU as if one still built batches
        raise PlanError(f"reserve_cpus={reserve_cpus} per GPU x {max(1, dnn.gpus)} GPU(s) = {reserved} vCPUs leaves "
                        f"none of {dnn_instance}'s {dnn.vcpus} vCPUs to build batches; give reserve_cpus below "
                        f"{-(-dnn.vcpus // max(1, dnn.gpus))}")
    return dnn_count * max(1, dnn.vcpus - reserved)


def _steps_per_epoch(epoch_samples: int, samples_per_step: int) -> int | None:
    """Steps in an epoch of ``epoch_samples`` samples (None: no epoch given)."""
    if isinstance(epoch_samples, bool) or not isinstance(epoch_samples, int) or epoch_samples < 0:
        raise PlanError(f"epoch_samples must be a whole number of samples > 0 (0 or left out: no $/epoch), "
                        f"got {epoch_samples!r}")
    steps = epoch_samples // samples_per_step if epoch_samples else None
    if epoch_samples and not steps:
        raise PlanError(f"epoch_samples={epoch_samples} is less than one step ({samples_per_step} samples)")
    return steps


def _cheapest(options: list[Option]) -> Option | None:
    """The lowest $/1000 images of the options that meet the target (fewer data nodes on a tie, so the
    homogeneous layout wins one); None: none does."""
    meeting = [o for o in options if o.meets_target]
    return min(meeting, key=lambda o: (o.usd_per_1000_images, o.data_count)) if meeting else None


@dataclass(frozen=True)
class Layouts:
    """The layouts one plan compares, priced: its DNN group alone, or with ``n`` data nodes of one type.
    A plan keeps it (``Plan.layouts``), so what prices layouts beside the plan (a sweep's groups)
    predicts their steps with the same model and figures, not a copy of them."""

    table: PriceTable
    dnn_instance: str
    dnn_count: int
    dnn: InstancePrice
    consumers: int
    own_cores: int                  # the DNN nodes' vCPUs left for building batches
    local_server: bool              # those vCPUs build batches beside the data nodes'
    preprocess_s: float
    gpu_step_s: float
    batch_size: int
    efficiency: float
    bytes_per_sample: float | None  # None: the network is not modelled
    encode_s: float
    flow_gbps: float | None
    goodput: float
    target_wait: float
    steps_per_epoch: int | None

    @property
    def images_per_step(self) -> int:
        """Samples one step takes, over every accelerator."""
        return self.batch_size * self.consumers

    def homogeneous(self) -> Option:
        """The DNN group building its own batches."""
        return self._priced("homogeneous", [], None, 0, self.own_cores, self._cores_step(self.own_cores))

    def with_data(self, data_type: str, row: InstancePrice, n: int) -> tuple[Prediction, Option]:
        """The predicted step of the DNN group fed by ``n`` data nodes of ``data_type`` (``row``), and that layout."""
        cores = n * row.vcpus + (self.own_cores if self.local_server else 0)
        gbps = None
        if self.bytes_per_sample is None:
            pred = self._cores_step(cores)
        else:
            pred = predict_network_step(self.preprocess_s, self.gpu_step_s, self.batch_size, self.consumers,
                                        row.vcpus, n, self.bytes_per_sample, row.baseline_gbps,
                                        self.dnn.baseline_gbps, self.dnn_count, self.flow_gbps, self.encode_s,
                                        self.efficiency, self.own_cores if self.local_server else 0.0, self.goodput)
            gbps = self._gbps_per_node(pred, n, self.bytes_per_sample)
        return pred, self._priced(f"{n} x {data_type}", [(data_type, n)], data_type, n, cores, pred, gbps)

    def _gbps_per_node(self, pred: Prediction, n: int, bytes_per_sample: float) -> float:
        """What each of ``n`` data nodes sends at ``pred``'s step, without what the DNN nodes' own servers build."""
        # every server is taken to run at the same share of what it can build, the data nodes included
        sent = self.images_per_step / pred.step_s * pred.network_items_s / pred.items_s
        return images_to_gbps(sent / n, bytes_per_sample)

    def workload(self, reserve_cpus: int, max_count: int, wire: str) -> dict:
        """The figures the plan was made for, as :attr:`Plan.workload` reports them."""
        return {"dnn_instance": self.dnn_instance, "dnn_count": self.dnn_count, "consumers": self.consumers,
                "preprocess_s": self.preprocess_s, "gpu_step_s": self.gpu_step_s, "batch_size": self.batch_size,
                "target_wait": self.target_wait, "reserve_cpus": reserve_cpus, "efficiency": self.efficiency,
                "local_server": self.local_server, "max_count": max_count, "steps_per_epoch": self.steps_per_epoch,
                "prices_region": self.table.region, "prices_as_of": self.table.as_of,
                "bytes_per_sample": self.bytes_per_sample, "encode_s": self.encode_s, "flow_gbps": self.flow_gbps,
                "goodput": self.goodput, "wire": wire, "dnn_baseline_gbps": self.dnn.baseline_gbps,
                "dnn_burst_gbps": self.dnn.burst_gbps,
                "demand_gbps": (None if self.bytes_per_sample is None else
                                images_to_gbps(self.images_per_step / self.gpu_step_s, self.bytes_per_sample))}

    def _cores_step(self, cores: float) -> Prediction:
        return predict_step(self.preprocess_s, self.gpu_step_s, cores, self.consumers, self.efficiency)

    def _priced(self, label: str, data: Cluster, data_instance: str | None, data_count: int, cores: float,
                pred: Prediction, gbps_per_node: float | None = None) -> Option:
        cluster = [(self.dnn_instance, self.dnn_count), *data]
        hourly = self.table.cluster_hourly(cluster)
        per_step = self.table.cost_per_step(cluster, pred.step_s)
        as_tuples = tuple(cast("tuple[str, int]", tuple(c)) for c in cluster)  # a caller's pairs may be lists
        return Option(label, as_tuples, data_instance, data_count, cores, pred.step_s,
                      pred.data_wait_fraction, hourly, per_step, 1000 * per_step,
                      self.steps_per_epoch * per_step if self.steps_per_epoch else None,
                      pred.data_wait_fraction <= self.target_wait + 1e-12, pred.binding,
                      1000 * per_step / self.images_per_step, gbps_per_node)


def _best_of_type(layouts: Layouts, data_type: str, max_count: int) -> Option:
    """The cheapest count of ``data_type`` data nodes that meets the target; when none does, the best it can do."""
    row = layouts.table.info(data_type)  # raises PriceError listing known types
    if layouts.bytes_per_sample is not None and row.baseline_gbps is None:
        log.warning("%s has no baseline_gbps in the instance table: its NIC is left out of the plan", data_type)
    options = []
    for n in range(1, max_count + 1):
        pred, option = layouts.with_data(data_type, row, n)
        options.append(option)
        if pred.bound == "gpu" or pred.binding == "DNN NIC":
            break  # more instances of this type would only add cost
    # While data-bound, $/step = (dnn $/h + n * data $/h) * k / n falls as n grows, so the cheapest
    # layout that meets the target is not always the smallest one: compare them all.
    return _cheapest(options) or options[-1]


def plan(table: PriceTable, dnn_instance: str, preprocess_s: float, gpu_step_s: float, batch_size: int,
         dnn_count: int = 1, data_types: list[str] | None = None, max_count: int = 16,
         target_wait: float = 0.05, reserve_cpus: int = 1, efficiency: float = 1.0,
         local_server: bool = False, epoch_samples: int = 0, bytes_per_sample: float | None = None,
         encode_s: float = 0.0, flow_gbps: float | None = SINGLE_FLOW_GBPS, goodput: float = 1.0,
         wire: str = "") -> Plan:
    """Cheapest layout keeping data wait <= ``target_wait``: no data group, or a data type and count.

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
        bytes_per_sample: bytes one sample takes on the wire (None: the network is not modelled).
        encode_s: data-node CPU seconds per sample the wire encoding adds.
        flow_gbps: one rank's flow to one data node (5 Gbps outside a cluster placement group, 10 inside).
        goodput: share of a NIC's Gbps that carries payload.
        wire: the wire encoding's name (reported only).

    Raises:
        PriceError: unknown instance type (listing the known ones). PlanError: bad figure.
    """
    _check_plan(target_wait, batch_size, dnn_count, max_count, reserve_cpus)
    dnn = table.info(dnn_instance)
    if dnn.gpus < 1:
        log.warning("%s has no GPU in the price table; planning as if it had one accelerator", dnn_instance)
    consumers = dnn_count * max(1, dnn.gpus)
    steps_per_epoch = _steps_per_epoch(epoch_samples, batch_size * consumers)
    if bytes_per_sample is not None:
        _positive("bytes_per_sample", bytes_per_sample)
    own_cores = _own_cores(dnn_instance, dnn, dnn_count, reserve_cpus)
    layouts = Layouts(table, dnn_instance, dnn_count, dnn, consumers, own_cores, local_server, preprocess_s,
                       gpu_step_s, batch_size, efficiency, bytes_per_sample, encode_s, flow_gbps, goodput, target_wait,
                       steps_per_epoch)
    homo = layouts.homogeneous()
    types = data_types if data_types else [t for t in table.known() if table.info(t).gpus == 0]
    candidates = [_best_of_type(layouts, t, max_count) for t in types]
    return Plan(layouts.workload(reserve_cpus, max_count, wire), homo,
                sorted(candidates, key=lambda c: c.usd_per_step), _cheapest([homo] + candidates), layouts)


__all__ = ["Layouts", "Option", "Plan", "PlanError", "PriceError", "Prediction", "plan", "predict_fed_step", "predict_network_step",
           "predict_step"]
