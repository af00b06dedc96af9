"""Plan a cluster: the cheapest layout, with a data group or without, that keeps the accelerators fed.

Each layout's step, data wait and binding resource (:class:`launcher.capacity.Binding`) come from
the capacity model (:mod:`launcher.capacity`): every accelerator takes one batch per step, one
batch costs ``preprocess_s`` seconds of one CPU core (``efficiency``: the share of ideal scaling
over many), the step is ``max(gpu_step_s, data_s)``, and given the bytes one sample takes on the
wire (``bytes_per_sample``) the data nodes' NICs, one flow per rank and the DNN nodes' NICs bound
the heterogeneous layouts too.

Homogeneous: the GPU instances' own vCPUs preprocess, minus ``reserve_cpus`` per GPU for the
trainer process. Heterogeneous: ``count`` data instances' vCPUs (plus the GPU instances' own
ones with ``local_server``, as the launcher's ``dnn_local_server=true`` does). One vCPU is
taken to equal one core of the machine ``preprocess_s`` was measured on; SageMaker bills
every instance for the whole job, so ``$/step = cluster $/h * step / 3600``.

The recommendation is the cheapest per 1,000 images of the layouts that meet the target, the
homogeneous one included: a data group is recommended only where it pays.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from launcher import capacity
from launcher.capacity import (SINGLE_FLOW_GBPS, Binding, Layout, Network, OwnCores, PlanError, Prediction,
                               items_to_gbps, non_negative, positive, share, whole)

from .cost import InstancePrice, PriceTable

log = logging.getLogger(__name__)


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
        The predicted step time, data time per step, data wait share and what binds the step
        (:func:`launcher.capacity.predict`: ``data_s = consumers x (preprocess_s + trainer_s) /
        (cores x efficiency)``).
    """
    positive("preprocess_s", preprocess_s)
    positive("gpu_step_s", gpu_step_s)
    positive("cores", cores)
    share("efficiency", efficiency)
    whole("consumers", consumers)
    non_negative("trainer_s", trainer_s)
    own = OwnCores(cores * efficiency, preprocess_s, trainer_s, serves=True)
    return capacity.predict(Layout(consumers, gpu_step_s, own=own))


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
    positive("preprocess_s", preprocess_s)  # the model checks the rest, each under its own name
    whole("data_nodes", data_nodes)
    nodes = (data_cores / data_nodes / preprocess_s,) * data_nodes if data_cores > 0 else ()
    own = OwnCores(own_cores, preprocess_s, trainer_s, serves=local_server)
    return capacity.predict(Layout(consumers, gpu_step_s, nodes, own))


def _fed(consumers: int, gpu_step_s: float, per_batch_s: float, node_cores: float, data_nodes: int,
         local_cores: float, network: Network | None, dnn_nodes: int) -> Layout:
    """``data_nodes`` data nodes of ``node_cores`` cores each, and ``local_cores`` of the DNN nodes' own
    (efficiency counted in), feeding ``consumers`` ranks; one batch costs ``per_batch_s`` core-seconds."""
    return Layout(consumers, gpu_step_s, (node_cores / per_batch_s,) * data_nodes,
                  OwnCores(local_cores, per_batch_s, serves=local_cores > 0), network, dnn_nodes)


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
        data_nic_gbps, dnn_nic_gbps: the nodes' NIC baselines (None: not limited); ``dnn_nodes`` DNN nodes.
        flow_gbps: one rank's flow to one data node (None: not limited).
        local_cores: the DNN nodes' own cores building batches (``local_server``), over no NIC.
        goodput: share of a link's Gbps that carries payload.
        efficiency, gpu_step_s: see :func:`predict_step`.
    """
    positive("preprocess_s", preprocess_s)  # the model checks the step, the ranks and the network by name
    share("efficiency", efficiency)
    non_negative("encode_s", encode_s)
    whole("batch_size", batch_size)
    positive("node_cores", node_cores)
    whole("data_nodes", data_nodes)
    non_negative("local_cores", local_cores)
    network = (Network(positive("bytes_per_sample", bytes_per_sample) * batch_size, data_nic_gbps, dnn_nic_gbps,
                       flow_gbps, goodput) if bytes_per_sample is not None else None)
    return capacity.predict(_fed(consumers, gpu_step_s, preprocess_s + batch_size * encode_s, node_cores * efficiency,
                                 data_nodes, local_cores * efficiency, network, dnn_nodes))


@dataclass(frozen=True)
class Workload:
    """The figures one plan is made for (what ``hetero plan`` is given), checked once by :func:`plan`.

    Args:
        dnn_instance: GPU instance type; ``dnn_count`` of them.
        preprocess_s: seconds one core needs per batch. gpu_step_s: the step with resident data.
        batch_size: samples per batch (per accelerator).
        data_types: CPU instance types to consider (empty: every type without GPUs).
        max_count: most data instances of one type to consider.
        target_wait: highest acceptable data-wait share of step time (0.05 = 5%).
        reserve_cpus: vCPUs per GPU kept for the trainer process (not preprocessing).
        efficiency: data-path scaling efficiency (see :func:`predict_step`).
        local_server: the GPU instances' own spare vCPUs also build batches.
        epoch_samples: samples per epoch, for $/epoch (0: not reported).
        bytes_per_sample: bytes one sample takes on the wire (None: the network is not modelled).
        encode_s: data-node CPU seconds per sample the wire encoding adds.
        flow_gbps: one rank's flow to one data node (5 Gbps outside a cluster placement group, 10
            inside; None: not limited).
        goodput: share of a NIC's Gbps that carries payload.
        wire, bytes_source: the wire encoding's name and where the bytes per sample come from
            (reported only).
    """

    dnn_instance: str
    preprocess_s: float
    gpu_step_s: float
    batch_size: int
    dnn_count: int = 1
    data_types: tuple[str, ...] = ()
    max_count: int = 16
    target_wait: float = 0.05
    reserve_cpus: int = 1
    efficiency: float = 1.0
    local_server: bool = False
    epoch_samples: int = 0
    bytes_per_sample: float | None = None
    encode_s: float = 0.0
    flow_gbps: float | None = SINGLE_FLOW_GBPS
    goodput: float = 1.0
    wire: str = ""
    bytes_source: str = ""

    def check(self) -> None:
        """Raise PlanError for a figure out of range (naming it)."""
        positive("preprocess_s", self.preprocess_s)
        positive("gpu_step_s", self.gpu_step_s)
        for name in ("batch_size", "dnn_count", "max_count"):
            whole(name, getattr(self, name))
        share("target_wait", self.target_wait, zero=True, one=False, fix="e.g. 0.05 for 5%")
        whole("reserve_cpus", self.reserve_cpus, low=0)
        share("efficiency", self.efficiency)
        whole("epoch_samples", self.epoch_samples, low=0, fix="0 or left out: no $/epoch")
        non_negative("encode_s", self.encode_s)
        share("goodput", self.goodput)
        for name in ("bytes_per_sample", "flow_gbps"):
            if getattr(self, name) is not None:
                positive(name, getattr(self, name))


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
    binding: Binding                   # what sets the step
    usd_per_1000_images: float
    gbps_per_data_node: float | None = None  # what each data node sends at the predicted step


@dataclass(frozen=True)
class Layouts:
    """The layouts one plan compares, priced: its DNN group alone, or with ``n`` data nodes of one type.
    A plan keeps it (``Plan.layouts``), so what prices layouts beside the plan (a sweep's groups)
    predicts their steps with the same model and figures, not a copy of them."""

    table: PriceTable
    workload: Workload
    dnn: InstancePrice

    @property
    def consumers(self) -> int:
        """Accelerators, over every DNN node."""
        return self.workload.dnn_count * max(1, self.dnn.gpus)

    @property
    def own_cores(self) -> int:
        """The DNN nodes' vCPUs left to build batches once ``reserve_cpus`` per GPU go to the trainers."""
        return self.workload.dnn_count * max(1, self.dnn.vcpus - self.workload.reserve_cpus * max(1, self.dnn.gpus))

    @property
    def images_per_step(self) -> int:
        """Samples one step takes, over every accelerator."""
        return self.workload.batch_size * self.consumers

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps in an epoch of ``epoch_samples`` (None: no epoch given)."""
        return self.workload.epoch_samples // self.images_per_step or None

    @property
    def demand_gbps(self) -> float | None:
        """What the accelerators take at the GPU step, into the DNN nodes (None: the network is not modelled)."""
        w = self.workload
        return None if w.bytes_per_sample is None else items_to_gbps(self.images_per_step / w.gpu_step_s,
                                                                      w.bytes_per_sample)

    def predict(self, row: InstancePrice | None = None, n: int = 0) -> Prediction:
        """The step of the DNN group fed by ``n`` data nodes of ``row`` (None: the group alone)."""
        w = self.workload
        network, per_batch_s = None, w.preprocess_s
        if row is not None and w.bytes_per_sample is not None:  # the encoding's CPU is spent for the wire only
            network = Network(w.bytes_per_sample * w.batch_size, row.baseline_gbps, self.dnn.baseline_gbps,
                              w.flow_gbps, w.goodput)
            per_batch_s += w.batch_size * w.encode_s
        local = self.own_cores if row is None or w.local_server else 0
        vcpus = row.vcpus if row is not None else 0
        return capacity.predict(_fed(self.consumers, w.gpu_step_s, per_batch_s, vcpus * w.efficiency, n,
                                     local * w.efficiency, network, w.dnn_count))

    def option(self, row: InstancePrice | None = None, n: int = 0) -> Option:
        """:meth:`predict`'s layout, priced."""
        w = self.workload
        pred = self.predict(row, n)
        data = ((row.instance_type, n),) if row is not None else ()
        cluster = ((w.dnn_instance, w.dnn_count), *data)
        hourly = self.table.cluster_hourly(cluster)
        per_step = capacity.usd_for(hourly, pred.step_s)
        gbps = None
        if row is not None and w.bytes_per_sample is not None:
            # what each data node sends, without what the DNN nodes' own servers build: every server is
            # taken to run at the same share of what it can build, the data nodes included
            sent = self.images_per_step / pred.step_s * pred.network_items_s / pred.items_s
            gbps = items_to_gbps(sent / n, w.bytes_per_sample)
        steps = self.steps_per_epoch
        return Option(f"{n} x {row.instance_type}" if row else "homogeneous", cluster,
                      row.instance_type if row else None, n,
                      n * row.vcpus + (self.own_cores if w.local_server else 0) if row else self.own_cores,
                      pred.step_s, pred.data_wait_fraction, hourly, per_step, 1000 * per_step,
                      steps * per_step if steps else None, pred.data_wait_fraction <= w.target_wait + 1e-12,
                      pred.binding, 1000 * per_step / self.images_per_step, gbps)


def _cheapest(options: Sequence[Option]) -> Option | None:
    """The lowest $/1000 images of the options that meet the target (fewer data nodes on a tie, so the
    homogeneous layout wins one); None: none does."""
    meeting = [o for o in options if o.meets_target]
    return min(meeting, key=lambda o: (o.usd_per_1000_images, o.data_count)) if meeting else None


@dataclass(frozen=True)
class Plan:
    """The planner's answer: the homogeneous layout, each data type's best, and the cheapest of them all
    that meets the target (``recommended``; the homogeneous layout when no data group pays)."""

    layouts: Layouts                  # the model the plan priced with
    homogeneous: Option
    candidates: tuple[Option, ...] = ()
    recommended: Option | None = None

    @property
    def workload(self) -> Workload:
        """The figures the plan was made for."""
        return self.layouts.workload

    @property
    def data_group(self) -> Option | None:
        """The cheapest data group that meets the target, whether or not the homogeneous layout costs less."""
        return _cheapest(self.candidates)

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``hetero plan --json`` writes it: the workload with what was derived from it, every layout."""
        lay = self.layouts
        workload = {**asdict(self.workload), "consumers": lay.consumers, "steps_per_epoch": lay.steps_per_epoch,
                    "prices_region": lay.table.region, "prices_as_of": lay.table.as_of,
                    "dnn_baseline_gbps": lay.dnn.baseline_gbps, "dnn_burst_gbps": lay.dnn.burst_gbps,
                    "demand_gbps": lay.demand_gbps}
        return {"workload": workload, "homogeneous": asdict(self.homogeneous),
                "candidates": [asdict(c) for c in self.candidates],
                "recommended": asdict(self.recommended) if self.recommended else None}


def _best_of_type(layouts: Layouts, data_type: str) -> Option:
    """The cheapest count of ``data_type`` data nodes that meets the target; when none does, the best it can do."""
    row = layouts.table.info(data_type)  # raises PlanError listing known types
    whole(f"vcpus of {data_type}", row.vcpus, fix="give its vcpus in the price file")
    if layouts.workload.bytes_per_sample is not None and row.baseline_gbps is None:
        log.warning("%s has no baseline_gbps in the instance table: its NIC is left out of the plan", data_type)
    options = []
    for n in range(1, layouts.workload.max_count + 1):
        options.append(layouts.option(row, n))
        if options[-1].binding in (Binding.GPU, Binding.DNN_NIC):
            break  # more instances of this type would only add cost
    # While data-bound, $/step = (dnn $/h + n * data $/h) * k / n falls as n grows, so the cheapest
    # layout that meets the target is not always the smallest one: compare them all.
    return _cheapest(options) or options[-1]


def plan(table: PriceTable, workload: Workload) -> Plan:
    """Cheapest layout keeping data wait <= ``workload.target_wait``: no data group, or a data type and count.

    Args:
        table: prices (hetero.planning.cost.load_prices()).
        workload: the figures to plan for.

    Raises:
        PlanError: a bad figure, or an unknown instance type (listing the known ones).
    """
    w = workload
    w.check()
    dnn = table.info(w.dnn_instance)
    if dnn.gpus < 1:
        log.warning("%s has no GPU in the price table; planning as if it had one accelerator", w.dnn_instance)
    gpus = max(1, dnn.gpus)
    if dnn.vcpus and w.reserve_cpus * gpus >= dnn.vcpus:
        # clamping would plan a node whose trainers hold every vCPU as if one still built batches
        raise PlanError(f"reserve_cpus={w.reserve_cpus} per GPU x {gpus} GPU(s) = {w.reserve_cpus * gpus} vCPUs "
                        f"leaves none of {w.dnn_instance}'s {dnn.vcpus} vCPUs to build batches; give reserve_cpus "
                        f"below {-(-dnn.vcpus // gpus)}")
    layouts = Layouts(table, w, dnn)
    if w.epoch_samples and not layouts.steps_per_epoch:
        raise PlanError(f"epoch_samples={w.epoch_samples} is less than one step ({layouts.images_per_step} samples)")
    homo = layouts.option()
    types = w.data_types or tuple(t for t in table.known() if table.info(t).gpus == 0)
    candidates = sorted((_best_of_type(layouts, t) for t in types), key=lambda c: c.usd_per_step)
    return Plan(layouts, homo, tuple(candidates), _cheapest([homo, *candidates]))


__all__ = ["Layouts", "Option", "Plan", "PlanError", "Prediction", "Workload", "plan", "predict_fed_step",
           "predict_network_step", "predict_step"]
