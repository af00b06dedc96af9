"""The capacity model: the step a layout gives, its data wait, what binds it, and what it costs.

One model, read by ``hetero plan`` and ``hetero bench`` (hetero/planning/planner.py, from a
profile) and by the live advice (launcher/advice/model.py, from a running job's figures), so the
two answer alike on the same figures. Rates are *items* per second: batches for the launcher and
the planner's layouts, images where :func:`hetero.planning.network.deliverable` asks.

The model (a steady-state pipeline: batches are built while the accelerators step):

* every rank takes one item per step; the step is ``max(compute_s, ranks / delivered)``
  (``compute_s``: the step with its batch already resident) and the data wait its share above
  ``compute_s``;
* each data node builds what its cores build (``Layout.nodes``), carries at most its NIC's
  baseline and, to each rank, one flow's cap (one TCP flow per rank and server); the DNN nodes'
  NICs bound what all data nodes deliver together (:class:`Network`). The *binding resource* is the smallest of
  ``cores``, ``data NIC``, ``DNN NIC`` and ``flow``;
* the DNN nodes' own cores (:class:`OwnCores`) give ``cores`` core-seconds per second: the cores
  they are given, less what other processes take of them (contention). The trainers take
  ``trainer_s`` of that for every item they consume (the finish stage where training runs on the
  CPU, a loader worker's hand-off), whichever server built it; with a server of their own
  (``serves``) the rest builds items at ``build_s`` each. So a trainer's core that also serves
  builds fewer batches than a whole core, and the fewer the more the data nodes send::

      delivered = remote + (cores - delivered x trainer_s) / build_s

  Without a server of their own the trainers' work can bind too (``cores / trainer_s``:
  binding ``trainer``).

Costs: SageMaker bills every instance for the whole job, so a step costs the cluster's $/h x
``step_s`` / 3600 (:func:`usd_per_step`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

SINGLE_FLOW_GBPS = 5.0            # one 5-tuple flow between EC2 instances outside a cluster placement group
PLACEMENT_GROUP_FLOW_GBPS = 10.0  # ... and inside one
BINDINGS = ("cores", "data NIC", "DNN NIC", "flow")  # a tie goes to the earlier name
NETWORK_BINDINGS = BINDINGS[1:]
TRAINER = "trainer"               # the trainers' own work on the DNN nodes' cores binds
COMPACT_WIRE = "jpeg:90"          # the compact wire encoding plan and advice name when the network binds


class CapacityError(ValueError):
    """A figure the model cannot use (naming the value and what it should be)."""


def _number(name: str, value: float, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (value <= 0 if positive else value < 0):
        raise CapacityError(f"{name}={value!r} must be a {'positive' if positive else 'non-negative'} number")


def _gbps(name: str, value: float | None) -> None:
    if value is not None:
        _number(name, value, positive=True)


def gbps_to_items(gbps: float, bytes_per_item: float, goodput: float = 1.0) -> float:
    """Items/s a link of ``gbps`` (1e9 bit/s) carries at ``bytes_per_item``."""
    return gbps * 1e9 * goodput / (8.0 * bytes_per_item)


def items_to_gbps(items_per_s: float, bytes_per_item: float) -> float:
    """Gbps ``items_per_s`` items of ``bytes_per_item`` need."""
    return items_per_s * bytes_per_item * 8.0 / 1e9


@dataclass(frozen=True)
class Network:
    """What carries items from the data nodes to the ranks (each Gbps None: not limited).

    Args:
        bytes_per_item: bytes one item takes on the wire.
        data_nic_gbps: one data node's NIC baseline; ``dnn_nic_gbps``: one DNN node's.
        flow_gbps: one flow's cap (:data:`SINGLE_FLOW_GBPS`, :data:`PLACEMENT_GROUP_FLOW_GBPS`).
        goodput: share of a link's Gbps that carries payload (TCP/IP and framing take the rest).
    """

    bytes_per_item: float
    data_nic_gbps: float | None = None
    dnn_nic_gbps: float | None = None
    flow_gbps: float | None = None
    goodput: float = 1.0

    def check(self) -> None:
        _number("bytes_per_item", self.bytes_per_item, positive=True)
        _gbps("data_nic_gbps", self.data_nic_gbps)
        _gbps("dnn_nic_gbps", self.dnn_nic_gbps)
        _gbps("flow_gbps", self.flow_gbps)
        if not 0 < self.goodput <= 1:
            raise CapacityError(f"goodput={self.goodput!r} must be a share in (0, 1]")

    def node_limits(self, ranks: int) -> dict[str, float]:
        """Items/s one data node's network carries: its NIC, and one flow to each of ``ranks``."""
        out = {}
        if self.data_nic_gbps is not None:
            out["data NIC"] = gbps_to_items(self.data_nic_gbps, self.bytes_per_item, self.goodput)
        if self.flow_gbps is not None:
            out["flow"] = ranks * gbps_to_items(self.flow_gbps, self.bytes_per_item, self.goodput)
        return out

    def dnn_limit(self, dnn_nodes: int) -> float | None:
        """Items/s the DNN nodes' NICs take from all data nodes together (None: not limited)."""
        if self.dnn_nic_gbps is None:
            return None
        return dnn_nodes * gbps_to_items(self.dnn_nic_gbps, self.bytes_per_item, self.goodput)


@dataclass(frozen=True)
class OwnCores:
    """The DNN nodes' own cores, all of them together (see the module docstring).

    Args:
        cores: core-seconds per second they give (their cores left after any reserve, times the
            data path's efficiency); for a measured server, its items/s with ``build_s=1``.
        build_s: core-seconds one item costs to build on them.
        trainer_s: core-seconds the trainers spend on them per item consumed.
        serves: they run a data server of their own (``dnn_local_server``, or homogeneous).
    """

    cores: float = 0.0
    build_s: float = 1.0
    trainer_s: float = 0.0
    serves: bool = False

    def check(self) -> None:
        _number("cores", self.cores)
        _number("build_s", self.build_s, positive=True)
        _number("trainer_s", self.trainer_s)


@dataclass(frozen=True)
class Layout:
    """One layout's figures.

    Args:
        ranks: consumers (accelerators), one item each per step.
        compute_s: the step with its item resident (the GPU step, or the emulated one).
        nodes: each data node's items/s from its cores (empty: no data node).
        own: the DNN nodes' own cores.
        network: what carries items from the data nodes (None: not modelled).
        dnn_nodes: DNN nodes (their NICs bound the network).
    """

    ranks: int
    compute_s: float
    nodes: tuple[float, ...] = ()
    own: OwnCores = field(default_factory=OwnCores)
    network: Network | None = None
    dnn_nodes: int = 1

    def check(self) -> None:
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1:
            raise CapacityError(f"ranks={self.ranks!r} must be an integer >= 1")
        if isinstance(self.dnn_nodes, bool) or not isinstance(self.dnn_nodes, int) or self.dnn_nodes < 1:
            raise CapacityError(f"dnn_nodes={self.dnn_nodes!r} must be an integer >= 1")
        _number("compute_s", self.compute_s, positive=True)
        for rate in self.nodes:
            _number("a data node's items/s", rate)
        self.own.check()
        if self.network is not None:
            self.network.check()


def uniform(data_nodes: int, items_s: float) -> tuple[float, ...]:
    """``data_nodes`` alike data nodes, each building ``items_s``."""
    return (items_s,) * data_nodes


@dataclass(frozen=True)
class Delivery:
    """Items/s the data nodes deliver over the network, what sets it, and each resource's ceiling
    (unbounded ones left out; ``cores`` is their cores' own). ``nodes_s``: what the data nodes
    send before the DNN nodes' NICs bound it (each node's cores or network, the smaller)."""

    items_s: float
    binding: str
    limits: dict[str, float] = field(default_factory=dict)
    nodes_s: float = 0.0


def remote(layout: Layout) -> Delivery:
    """What the data nodes deliver to the ranks over the network (0 without a data node)."""
    net = layout.network
    node = net.node_limits(layout.ranks) if net is not None else {}
    cap = min(node.values()) if node else math.inf
    limits = {"cores": sum(layout.nodes)}
    for name, per_node in node.items():
        limits[name] = per_node * len(layout.nodes)
    dnn = net.dnn_limit(layout.dnn_nodes) if net is not None else None
    if dnn is not None and layout.nodes:
        limits["DNN NIC"] = dnn
    # a node delivers the smaller of its cores and its network; the DNN NICs bound all together
    sent = sum(min(rate, cap) for rate in layout.nodes)
    delivered = min(sent, dnn) if dnn is not None and layout.nodes else sent
    # with nodes alike, the smallest ceiling is what they deliver; a tie goes to the earlier name
    binding = min(limits, key=lambda k: (limits[k], BINDINGS.index(k)))
    return Delivery(delivered, binding, limits, sent)


def delivered(layout: Layout, over_network: float) -> tuple[float, str]:
    """(items/s the ranks get when the data nodes send ``over_network`` items/s, what binds the
    DNN nodes' own part: ``trainer``, or "" where nothing of theirs does)."""
    own = layout.own
    if own.trainer_s > 0 and own.cores < over_network * own.trainer_s:  # the trainers cannot take what arrives
        return own.cores / own.trainer_s, TRAINER
    if not own.serves:
        return over_network, ""
    # their time: trainer_s per item consumed (built anywhere), build_s per item they build
    return (over_network * own.build_s + own.cores) / (own.build_s + own.trainer_s), ""


@dataclass(frozen=True)
class Prediction:
    """The predicted steady-state step of one layout.

    ``items_s``: what its data path delivers at full pace (the ranks take ``ranks / step_s`` of
    it); ``network_items_s``: the part the data nodes send; ``binding``: ``gpu`` when the
    accelerators set the step, else what bounds the data path.
    """

    step_s: float
    data_s: float
    data_wait_fraction: float
    bound: str        # "gpu" or "data"
    binding: str
    items_s: float
    network_items_s: float

    @property
    def local_items_s(self) -> float:
        """What the DNN nodes' own cores build at full pace."""
        return self.items_s - self.network_items_s


def predict(layout: Layout) -> Prediction:
    """The step, data wait and binding resource of ``layout``.

    Raises:
        CapacityError: a figure out of range (naming it).
    """
    layout.check()
    net = remote(layout)
    items_s, own_binding = delivered(layout, net.items_s)
    data_s = layout.ranks / items_s if items_s > 0 else math.inf
    step_s = max(layout.compute_s, data_s)
    bound = "data" if data_s > layout.compute_s else "gpu"
    if bound == "gpu":
        binding = "gpu"
    elif own_binding:
        binding = own_binding
    elif layout.nodes:
        binding = net.binding
    else:
        binding = "cores"
    wait = (step_s - layout.compute_s) / step_s if math.isfinite(step_s) else 1.0
    return Prediction(step_s, data_s, wait, bound, binding, items_s, net.items_s)


def step_s(layout: Layout) -> float:
    """The predicted step of ``layout`` (:func:`predict`'s ``step_s``)."""
    return predict(layout).step_s


def usd_per_step(usd_per_hour: float, step_s: float) -> float:
    """Dollars one step costs on a cluster of ``usd_per_hour`` when it takes ``step_s``."""
    return usd_per_hour * step_s / 3600.0


def usd_per_epoch(usd_per_hour: float, step_s: float, steps_per_epoch: int) -> float:
    """Dollars an epoch of ``steps_per_epoch`` steps costs."""
    return steps_per_epoch * usd_per_step(usd_per_hour, step_s)


def cluster_usd_per_hour(groups: Sequence[tuple[float, int]]) -> float:
    """$/h of a cluster given as (one instance's $/h, count) pairs."""
    return sum(price * count for price, count in groups)


__all__ = ["BINDINGS", "COMPACT_WIRE", "CapacityError", "Delivery", "Layout", "NETWORK_BINDINGS", "Network", "OwnCores",
           "PLACEMENT_GROUP_FLOW_GBPS", "Prediction", "SINGLE_FLOW_GBPS", "TRAINER", "cluster_usd_per_hour",
           "delivered", "gbps_to_items", "items_to_gbps", "predict", "remote", "step_s", "uniform", "usd_per_epoch",
           "usd_per_step"]
