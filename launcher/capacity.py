"""The capacity model: the step a layout gives, its data wait, what binds it, and what it costs.

One model, read by ``hetero plan`` and ``hetero bench`` (hetero/planning/planner.py, from a
profile) and by the live advice (launcher/advice/model.py, from a running job's figures), so the
two answer alike on the same figures. Rates are *items* per second: batches for the launcher and
the planner's layouts, images where a caller counts images.

The model (a steady-state pipeline: batches are built while the accelerators step):

* every rank takes one item per step; the step is ``max(compute_s, ranks / delivered)``
  (``compute_s``: the step with its batch already resident) and the data wait its share above
  ``compute_s``;
* each data node builds what its cores build (``Layout.nodes``), carries at most its NIC's
  baseline and, to each rank, one flow's cap (one TCP flow per rank and server); the DNN nodes'
  NICs bound what all data nodes deliver together (:class:`Network`). The *binding resource*
  (:class:`Binding`) is the smallest of the cores, the data NICs, the DNN NICs and the flows;
* the DNN nodes' own cores (:class:`OwnCores`) give ``cores`` core-seconds per second: the cores
  they are given, less what other processes take of them (contention). The trainers take
  ``trainer_s`` of that for every item they consume (the finish stage where training runs on the
  CPU, a loader worker's hand-off), whichever server built it; with a server of their own
  (``serves``) the rest builds items at ``build_s`` each. So a trainer's core that also serves
  builds fewer batches than a whole core, and the fewer the more the data nodes send::

      delivered = remote + (cores - delivered x trainer_s) / build_s

  Without a server of their own the trainers' work can bind too (``cores / trainer_s``:
  :attr:`Binding.TRAINER`).

Costs: SageMaker bills every instance for the whole job, so a cluster of $/h costs $/h x seconds
/ 3600 over any stretch of it (:func:`usd_for`: a step, an epoch).

Every figure a caller gives is checked by the functions here (:func:`positive`,
:func:`non_negative`, :func:`share`, :func:`whole`), and a bad one raises :class:`PlanError`
naming the value and what it should be (``fix``: what to give instead, where the rule alone does
not say).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import NoReturn

SINGLE_FLOW_GBPS = 5.0            # one 5-tuple flow between EC2 instances outside a cluster placement group
PLACEMENT_GROUP_FLOW_GBPS = 10.0  # ... and inside one
COMPACT_WIRE = "jpeg:90"          # the compact wire encoding plan and advice name when the network binds


class PlanError(ValueError):
    """A figure the model, the planner or the price table cannot use (naming the value and the fix)."""


def _fail(name: str, value: object, must: str, fix: str) -> NoReturn:
    raise PlanError(f"{name}={value!r} must be {must}" + (f"; {fix}" if fix else ""))


def _real(value: object) -> bool:
    # bool is an int to Python, never a figure; nan and inf compare falsely or pass every bound
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive(name: str, value: float, fix: str = "") -> float:
    """``value`` as a float when it is a finite number above 0; else a PlanError naming it."""
    if not (_real(value) and value > 0):
        _fail(name, value, "a positive number", fix)
    return float(value)


def non_negative(name: str, value: float, fix: str = "") -> float:
    """``value`` as a float when it is a finite number >= 0; else a PlanError naming it."""
    if not (_real(value) and value >= 0):
        _fail(name, value, "a number >= 0", fix)
    return float(value)


def share(name: str, value: float, *, zero: bool = False, one: bool = True, fix: str = "") -> float:
    """``value`` as a float when it is a share in (0, 1] (``zero``: 0 allowed; ``one``: 1 allowed)."""
    if not (_real(value) and (value >= 0 if zero else value > 0) and (value <= 1 if one else value < 1)):
        _fail(name, value, f"a share in {'[' if zero else '('}0, 1{']' if one else ')'}", fix)
    return float(value)


def whole(name: str, value: int, low: int = 1, fix: str = "") -> int:
    """``value`` when it is an integer >= ``low``; else a PlanError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        _fail(name, value, f"an integer >= {low}", fix)
    return value


class Binding(enum.StrEnum):
    """What sets a layout's step: the accelerators, or the resource that bounds its data path.
    The value is the word the text output prints."""

    GPU = "gpu"
    CORES = "cores"
    DATA_NIC = "data NIC"
    DNN_NIC = "DNN NIC"
    FLOW = "flow"
    TRAINER = "trainer"           # the trainers' own work on the DNN nodes' cores

    @property
    def network(self) -> bool:
        """A NIC or a flow: sending fewer bytes per item would lift it."""
        return self in (Binding.DATA_NIC, Binding.DNN_NIC, Binding.FLOW)


# A tie goes to the earlier: the DNN NICs first (more data nodes cannot lift them), then the
# cores before the network (more nodes lift both).
_TIE_ORDER = (Binding.DNN_NIC, Binding.CORES, Binding.DATA_NIC, Binding.FLOW)


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
        """Raise PlanError for a figure out of range."""
        positive("bytes_per_item", self.bytes_per_item)
        for name in ("data_nic_gbps", "dnn_nic_gbps", "flow_gbps"):
            if getattr(self, name) is not None:
                positive(name, getattr(self, name))
        share("goodput", self.goodput)

    def node_limits(self, ranks: int) -> dict[Binding, float]:
        """Items/s one data node's network carries: its NIC, and one flow to each of ``ranks``."""
        out: dict[Binding, float] = {}
        if self.data_nic_gbps is not None:
            out[Binding.DATA_NIC] = gbps_to_items(self.data_nic_gbps, self.bytes_per_item, self.goodput)
        if self.flow_gbps is not None:
            out[Binding.FLOW] = ranks * gbps_to_items(self.flow_gbps, self.bytes_per_item, self.goodput)
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
        """Raise PlanError for a figure out of range."""
        non_negative("cores", self.cores)
        positive("build_s", self.build_s)
        non_negative("trainer_s", self.trainer_s)


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
        """Raise PlanError for a figure out of range."""
        whole("ranks", self.ranks)
        whole("dnn_nodes", self.dnn_nodes)
        positive("compute_s", self.compute_s)
        for rate in self.nodes:
            non_negative("a data node's items/s", rate)
        self.own.check()
        if self.network is not None:
            self.network.check()


@dataclass(frozen=True)
class Delivery:
    """Items/s the data nodes deliver over the network, what sets it, and each resource's ceiling
    (unbounded ones left out; ``CORES`` is their cores' own). ``nodes_s``: what the data nodes
    send before the DNN nodes' NICs bound it (each node's cores or network, the smaller)."""

    items_s: float
    binding: Binding
    limits: dict[Binding, float] = field(default_factory=dict)
    nodes_s: float = 0.0


def remote(layout: Layout) -> Delivery:
    """What the data nodes deliver to the ranks over the network (0 without a data node)."""
    net = layout.network
    node = net.node_limits(layout.ranks) if net is not None else {}
    cap = min(node.values()) if node else math.inf
    limits = {Binding.CORES: sum(layout.nodes), **{name: each * len(layout.nodes) for name, each in node.items()}}
    dnn = net.dnn_limit(layout.dnn_nodes) if net is not None else None
    if dnn is not None and layout.nodes:
        limits[Binding.DNN_NIC] = dnn
    # a node delivers the smaller of its cores and its network; the DNN NICs bound all together
    sent = sum(min(rate, cap) for rate in layout.nodes)
    delivered = min(sent, dnn) if dnn is not None and layout.nodes else sent
    # with nodes alike, the smallest ceiling is what they deliver
    binding = min(limits, key=lambda k: (limits[k], _TIE_ORDER.index(k)))
    return Delivery(delivered, binding, limits, sent)


def _delivered(layout: Layout, over_network: float) -> tuple[float, Binding | None]:
    """(items/s the ranks get when the data nodes send ``over_network`` items/s, TRAINER where the
    trainers' own work binds, else None)."""
    own = layout.own
    if own.trainer_s > 0 and own.cores < over_network * own.trainer_s:  # the trainers cannot take what arrives
        return own.cores / own.trainer_s, Binding.TRAINER
    if not own.serves:
        return over_network, None
    # their time: trainer_s per item consumed (built anywhere), build_s per item they build
    return (over_network * own.build_s + own.cores) / (own.build_s + own.trainer_s), None


@dataclass(frozen=True)
class Prediction:
    """The predicted steady-state step of one layout.

    ``items_s``: what its data path delivers at full pace (the ranks take ``ranks / step_s`` of
    it); ``network_items_s``: the part the data nodes send; ``binding``: :attr:`Binding.GPU` when
    the accelerators set the step, else what bounds the data path.
    """

    step_s: float
    data_s: float
    data_wait_fraction: float
    binding: Binding
    items_s: float
    network_items_s: float

    @property
    def local_items_s(self) -> float:
        """What the DNN nodes' own cores build at full pace."""
        return self.items_s - self.network_items_s


def predict(layout: Layout) -> Prediction:
    """The step, data wait and binding resource of ``layout``.

    Raises:
        PlanError: a figure out of range (naming it).
    """
    layout.check()
    net = remote(layout)
    items_s, own_binding = _delivered(layout, net.items_s)
    data_s = layout.ranks / items_s if items_s > 0 else math.inf
    step_s = max(layout.compute_s, data_s)
    if data_s <= layout.compute_s:
        binding = Binding.GPU
    else:
        binding = own_binding or (net.binding if layout.nodes else Binding.CORES)
    wait = (step_s - layout.compute_s) / step_s if math.isfinite(step_s) else 1.0
    return Prediction(step_s, data_s, wait, binding, items_s, net.items_s)


def usd_for(usd_per_hour: float, seconds: float) -> float:
    """Dollars a cluster of ``usd_per_hour`` costs over ``seconds`` of it (a step, an epoch)."""
    return usd_per_hour * seconds / 3600.0


__all__ = ["Binding", "COMPACT_WIRE", "Delivery", "Layout", "Network", "OwnCores", "PLACEMENT_GROUP_FLOW_GBPS",
           "PlanError", "Prediction", "SINGLE_FLOW_GBPS", "gbps_to_items", "items_to_gbps", "non_negative",
           "positive", "predict", "remote", "share", "usd_for", "whole"]
