"""Live advice: how many data nodes a running job should add, or could drop, and what that costs.

The capacity model (:mod:`launcher.capacity`, the one ``hetero plan`` predicts with) fed with
live figures in place of a profile:

* each of the job's ``R`` ranks takes one batch per step and needs ``compute_s`` of its own per
  step: the measured step time minus the measured data wait, plus the CPU time the rank spent
  inside that wait receiving its batch (more data nodes do not take that work off the rank);
* each data server builds what it built per second divided by its workers' busy share over the
  window (a starved job keeps them busy, so this is what they make; a server with idle workers
  has that much headroom), and at least what it delivered (all of it when its busy share is
  unknown). The data nodes are the model's data nodes; a DNN host's own server
  (``dnn_local_server``) is the DNN nodes' own cores, at what it was measured to build;
* the model gives the step for the data nodes there are, and for ``k`` more of the mean capacity
  of the job's data nodes (or ``r`` fewer).

``k`` is the fewest nodes whose capacity covers the ranks' demand ``R / compute_s`` with
``HEADROOM`` to spare (10 %: servers run near full load only with bursts of waiting,
as batch times and fetches vary), and none while the step waits on data less than
``MIN_OUT_WAIT`` (1 %) of it: a node more would not shorten it (the advice says so). When the
servers have more than that, the advice is how many data nodes could go (always keeping one)
with that headroom kept. Costs come from a price map (instance type -> $/h): the change in $/h,
the changed nodes' cost over one epoch at the predicted step time, and the whole job's $/epoch
before and after when the DNN instance's price is known too. Nothing here measures or talks to
a server: ``launcher/advice/advisor.py`` gathers the figures.

The network (the model's, with the bytes per batch the servers sent in the window): a data node
delivers at most its NIC baseline and, to each rank, one flow's cap; the DNN nodes' NICs bound
what all data nodes together deliver. The advice names the binding resource as the model does
from what the data nodes' cores build (``cores``, ``data NIC``, ``DNN NIC`` or ``flow``; none
without a network figure) and, when the network binds, says what helps: more data nodes only
while their NICs bind, otherwise a compact wire encoding or instances with more bandwidth.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from .. import capacity
from ..capacity import COMPACT_WIRE, Binding, non_negative, positive, usd_for, whole

HEADROOM = 0.10           # spare capacity the advice keeps over the ranks' demand
MIN_BUSY = 0.05           # below this busy share a server's headroom is not extrapolated further
MIN_COMPUTE_SHARE = 0.01  # a step that is (almost) all data wait: take compute as this share of it
MAX_CHANGE = 256          # the most nodes one piece of advice adds
MIN_OUT_WAIT = 0.01       # below this share of the step waiting on data no node is added (none would shorten it)


@dataclass(frozen=True)
class ServerFigures:
    """One data server over the advice window.

    Args:
        address: host:port of the server.
        batches_per_s: batches it delivered per second (to every rank together).
        busy_fraction: share of its workers' time spent building batches (None: unknown).
        built_per_s: batches it built per second over the same time as ``busy_fraction`` (None:
            take ``batches_per_s``). Built, not delivered, over busy gives the build rate also
            while the consumers live on batches built earlier (the end of training).
        new: it joined during the window (no figures from its start), so it counts at the mean
            capacity of the data nodes that were there.
        data_node: False for a DNN host's own server (``dnn_local_server``): it adds capacity but
            is not a data node that could be added or removed.
    """

    address: str
    batches_per_s: float
    busy_fraction: float | None = None
    data_node: bool = True
    built_per_s: float | None = None
    new: bool = False
    bytes_per_batch: float | None = None


@dataclass(frozen=True)
class LiveFigures:
    """What the DNN node measured over the advice window.

    Args:
        step_s: mean step time of the window (rank 0's, or the slowest rank's).
        data_wait_s: mean time per step the rank waited for its batch.
        ranks: ranks taking batches (the job's world size).
        servers: every data server's figures.
        steps_per_epoch: steps each rank takes per epoch (None: no $/epoch).
        data_instance: the data nodes' instance type.
        dnn_instance: the DNN nodes' instance type; ``dnn_count`` of them.
        fetch_cpu_s: mean CPU time per step the rank's own thread spent inside the wait (receiving
            and unpacking the batch).
        bytes_per_batch: bytes the data servers sent per batch over the window (None: unknown, the
            network is left out).
        data_nic_gbps, dnn_nic_gbps: the instance types' NIC baselines (None: unknown).
        flow_gbps: one flow's cap (None: not limited).
        batch_size: samples per batch (for bytes per sample in the advice).
    """

    step_s: float
    data_wait_s: float
    ranks: int
    servers: tuple[ServerFigures, ...]
    steps_per_epoch: int | None = None
    data_instance: str = ""
    dnn_instance: str = ""
    dnn_count: int = 1
    fetch_cpu_s: float = 0.0
    bytes_per_batch: float | None = None
    data_nic_gbps: float | None = None
    dnn_nic_gbps: float | None = None
    flow_gbps: float | None = None
    batch_size: int = 0


@dataclass(frozen=True)
class Advice:
    """The answer: ``change`` data nodes (+k to add, -r to drop, 0 to keep; None: cannot tell)."""

    change: int | None
    data_nodes: int
    data_instance: str
    step_s: float
    compute_s: float
    data_wait_fraction: float
    predicted_step_s: float
    predicted_wait_fraction: float
    ranks: int
    delivered_per_s: float
    capacity_per_s: float
    node_capacity_per_s: float | None
    node_usd_per_hour: float | None
    change_usd_per_hour: float | None
    change_usd_per_epoch: float | None
    job_usd_per_epoch: float | None
    predicted_job_usd_per_epoch: float | None
    steps_per_epoch: int | None
    note: str = ""
    binding: Binding | None = None         # what bounds the data nodes' delivery (None: no network figure to tell)
    bytes_per_sample: float | None = None  # on the wire, over the window
    network_note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def server_capacity(server: ServerFigures) -> float:
    """Batches/s the server could deliver: what it built over its workers' busy share (floored at
    :data:`MIN_BUSY`) and at least what it delivered; as delivered when the share is unknown."""
    delivered = max(0.0, server.batches_per_s)
    if server.busy_fraction is None or delivered <= 0:
        return delivered
    built = delivered if server.built_per_s is None else max(0.0, server.built_per_s)
    return max(delivered, built / min(1.0, max(MIN_BUSY, server.busy_fraction)))


def data_node_rates(servers: Sequence[ServerFigures],
                    node_limit: float | None = None) -> tuple[tuple[float, ...], float | None]:
    """(each data node's batches/s, the mean capacity of one data node; None: unknown).

    The node unit is the mean over the data nodes whose capacity was measured (busy share known),
    else over those present the whole window (as delivered). A data node not measured yet counts
    at that unit when some were measured (it is taken to be like them), one that joined during the
    window always does (what it delivered since its start is no rate). ``node_limit``: batches/s
    one data node's network carries (None: not limited).
    """
    def cap(s: ServerFigures) -> float:
        own = server_capacity(s)
        return own if node_limit is None else min(own, node_limit)

    nodes = [s for s in servers if s.data_node]
    measured = [cap(s) for s in nodes if not s.new and s.busy_fraction is not None]
    present = [cap(s) for s in nodes if not s.new]
    pool = [c for c in (measured or present) if c > 0]
    unit = sum(pool) / len(pool) if pool else None
    rates = tuple(unit if unit is not None and (s.new or (measured and s.busy_fraction is None)) else cap(s)
                  for s in nodes)
    return rates, unit


def network_of(figures: LiveFigures) -> capacity.Network | None:
    """The window's network in the capacity model's terms (items are batches); None where the bytes
    per batch are unknown (the network is left out)."""
    if not figures.bytes_per_batch or figures.bytes_per_batch <= 0:
        return None
    return capacity.Network(figures.bytes_per_batch, figures.data_nic_gbps or None, figures.dnn_nic_gbps or None,
                            figures.flow_gbps or None)


def layout_of(figures: LiveFigures, compute_s: float, rates: Sequence[float]) -> capacity.Layout:
    """The job as the capacity model sees it: data nodes building ``rates`` batches/s, the DNN
    hosts' own servers (``data_node=False``) at what they were measured to build."""
    local = sum(server_capacity(s) for s in figures.servers if not s.data_node)
    return capacity.Layout(figures.ranks, compute_s, tuple(rates), capacity.OwnCores(local, 1.0, serves=True),
                           network_of(figures), figures.dnn_count)


def _wait_share(step_s: float, compute_s: float) -> float:
    return 0.0 if not math.isfinite(step_s) or step_s <= 0 else max(0.0, (step_s - compute_s) / step_s)


def advise(figures: LiveFigures, prices: Mapping[str, float] | None = None) -> Advice:
    """Data nodes to add (or that could go) for ``figures``, with the predicted step and costs.

    Args:
        figures: the live figures of one window.
        prices: instance type -> on-demand $/h; types without a price give no costs.

    Returns:
        The advice; ``change`` is None when no data node delivered anything to size one by.

    Raises:
        launcher.capacity.PlanError: a figure out of range (naming it).
    """
    positive("step_s", figures.step_s)
    non_negative("data_wait_s", figures.data_wait_s)
    whole("ranks", figures.ranks)
    prices = prices or {}
    step, ranks = figures.step_s, figures.ranks
    wait_share = min(1.0, figures.data_wait_s / step)
    own = step - figures.data_wait_s + min(max(0.0, figures.fetch_cpu_s), figures.data_wait_s)
    compute = max(own, MIN_COMPUTE_SHARE * step)
    note = "the step is almost all data wait: compute time taken as 1% of it" if own < MIN_COMPUTE_SHARE * step else ""
    network = network_of(figures)
    node_net = network.node_limits(ranks) if network is not None else {}
    rates, node_cap = data_node_rates(figures.servers, min(node_net.values()) if node_net else None)
    layout = layout_of(figures, compute, rates)
    sent, now = capacity.remote(layout), capacity.predict(layout)
    local, remote = now.local_items_s, sent.nodes_s    # remote: what the data nodes send, before the DNN NICs
    dnn_net = sent.limits.get(Binding.DNN_NIC)
    nodes = len(rates)
    needed = ranks * (1 + HEADROOM) / compute   # batches/s the ranks take, plus the headroom
    change: int | None = None
    if node_cap is None:
        note = note or "no data node delivered a batch in this window: nothing to size a node by"
    elif now.items_s < needed and wait_share < MIN_OUT_WAIT:
        # short of the headroom but not waiting: a node more would cost and leave the step as it is
        change = 0
        note = note or (f"no node to add while the step waits {100 * wait_share:.1f}% on data (under "
                        f"{100 * MIN_OUT_WAIT:g}%): the data side makes {now.items_s:.1f} batches/s, the ranks take "
                        f"{ranks / compute:.1f}, {100 * HEADROOM:g}% headroom would need {needed:.1f}")
    elif now.items_s < needed:
        reach = needed if dnn_net is None else min(needed, local + dnn_net)  # the DNN NIC caps what more nodes add
        change = max(0, math.ceil(min(float(MAX_CHANGE), (reach - local - remote) / node_cap - 1e-9)))
    else:
        # what the data nodes send beyond the DNN NIC's share is spare as well: local + remote - needed either way
        change = -math.floor(min(float(max(0, nodes - 1)), max(0.0, local + remote - needed) / node_cap + 1e-9))
    pred = capacity.predict(layout_of(figures, compute, _changed(rates, change, node_cap or 0.0)))
    binding = None
    if node_cap is not None and (node_net or dnn_net is not None):  # without a network figure a throttled NIC
        # looks like idle cores; with one, the model names what binds from what the nodes' cores build
        built, _ = data_node_rates(figures.servers)
        binding = capacity.remote(layout_of(figures, compute, _changed(built, change, node_cap))).binding
    price, dnn_price = prices.get(figures.data_instance), prices.get(figures.dnn_instance)
    steps = figures.steps_per_epoch
    after = pred.step_s
    change_h = change * price if change is not None and price is not None else None
    change_epoch = (usd_for(change_h, steps * after) if change_h is not None and steps
                    and math.isfinite(after) else None)
    job_now = job_after = None
    if price is not None and dnn_price is not None and steps:
        dnn_h = figures.dnn_count * dnn_price
        job_now = usd_for(dnn_h + nodes * price, steps * step)
        if change is not None and math.isfinite(after):
            job_after = usd_for(dnn_h + (nodes + change) * price, steps * after)
    return Advice(change=change, data_nodes=nodes, data_instance=figures.data_instance, step_s=step,
                  compute_s=compute, data_wait_fraction=wait_share, predicted_step_s=after,
                  predicted_wait_fraction=_wait_share(after, compute), ranks=ranks,
                  delivered_per_s=sum(s.batches_per_s for s in figures.servers), capacity_per_s=now.items_s,
                  node_capacity_per_s=node_cap, node_usd_per_hour=price, change_usd_per_hour=change_h,
                  change_usd_per_epoch=change_epoch, job_usd_per_epoch=job_now,
                  predicted_job_usd_per_epoch=job_after, steps_per_epoch=steps, note=note, binding=binding,
                  bytes_per_sample=(figures.bytes_per_batch / figures.batch_size
                                    if figures.bytes_per_batch and figures.batch_size > 0 else None),
                  network_note=_network_note(figures, binding, node_net, dnn_net))


def _changed(rates: tuple[float, ...], change: int | None, node_cap: float) -> tuple[float, ...]:
    """The data nodes' batches/s after ``change``: added nodes at ``node_cap`` each; the nodes left
    after a drain at the mean of what the group then builds (each drained node takes ``node_cap``,
    whichever it is)."""
    if not change:
        return rates
    if change > 0:
        return rates + (node_cap,) * change
    left = len(rates) + change
    return (max(0.0, sum(rates) + change * node_cap) / left,) * left


def _network_note(f: LiveFigures, binding: Binding | None, node_net: dict[Binding, float],
                  dnn_net: float | None) -> str:
    """What helps when the network binds ("" otherwise)."""
    kind, wire = f.data_instance or "data node", f"a compact wire encoding (wire_encoding={COMPACT_WIRE})"
    if binding is Binding.DNN_NIC:
        return (f"the DNN NIC binds: {f.dnn_count} x {f.dnn_instance or 'DNN node'} at {f.dnn_nic_gbps:g} Gbps takes "
                f"{dnn_net:.1f} batches/s; more data nodes cannot raise that: {wire} or a DNN instance with more "
                "bandwidth")
    if binding is Binding.FLOW:
        return (f"one flow per rank carries {f.flow_gbps:g} Gbps ({node_net[Binding.FLOW]:.1f} batches/s from each "
                f"{kind}): more data nodes, a cluster placement group (10 Gbps per flow) or {wire}")
    if binding is Binding.DATA_NIC:
        return (f"each {kind}'s NIC binds ({f.data_nic_gbps:g} Gbps baseline, {node_net[Binding.DATA_NIC]:.1f} "
                f"batches/s): a network-optimised type (c5n) or {wire} needs fewer nodes")
    return ""


def steps_per_epoch(num_samples: int, batch_size: int, drop_last: bool, ranks: int) -> int | None:
    """Each rank's steps per epoch from the data set's size (ranks get equal counts, rest dropped)."""
    if num_samples <= 0 or batch_size <= 0 or ranks <= 0:
        return None
    batches = num_samples // batch_size if drop_last else -(-num_samples // batch_size)
    return batches // ranks or None

