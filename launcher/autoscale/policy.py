"""The autoscaler's policy: from the live advice's figures to "add n", "drain n" or "hold".

Pure: no clock, no I/O. :func:`decide` takes one :class:`Demand` (the advice's figures, the one
input a new binding resource plugs into), the :class:`Limits`, the :class:`State` carried from
the last decision and the time, and returns the :class:`Decision` with the figures it used and
the next state.

* **Target.** The advised node count (``data_nodes + change``), clamped to ``[min_nodes,
  max_nodes]`` and to the nodes the $/h cap pays for.
* **Out** when the target is above the nodes the job has or was promised (a scale-out not yet
  joined counts as promised until ``join_timeout_s``, less serving nodes lost meanwhile; a
  drain whose nodes have not left yet counts them as gone until ``drain_timeout_s``), the job
  waits on data at least ``out_wait_share`` of its step, and ``cooldown_s`` passed since the
  last action.
* **In** (by draining) when the target is below those nodes in ``in_after`` advice windows in a
  row, the job waits on data at most ``in_wait_share``, and ``2 x cooldown_s`` passed since the
  last scale-out (so the advice has seen the new nodes at work). This and the advice's own
  headroom (it adds a node below 1.1x the demand, drops one only above it with the headroom
  kept) are the hysteresis: the same figures never give an out and then an in.
* **Limits first.** Fewer nodes than ``min_nodes`` scale out, more than ``max_nodes`` or than
  the cap pays for drain, whatever the wait and the cooldown.
* **No price, no growth under a cap.** With a $/h cap and no price for the data node, what the
  cap pays for is unknown: the group neither grows (not even up to ``min_nodes``) nor drains
  for the cap; the controller refuses such a start (``Autoscaler.check_start``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, cast

OUT, IN, HOLD = "out", "in", "hold"


@dataclass(frozen=True)
class Demand:
    """The live advice's figures the policy acts on.

    Args:
        nodes: data nodes serving now (the advice's ``data_nodes``).
        advised_nodes: data nodes the advice says the job needs (None: it cannot tell).
        data_wait_share: share of the step the ranks wait on data (0..1).
        node_rate: batches/s one data node delivers (None: unknown).
        node_usd_per_hour: one data node's price (None: unknown; the $ cap cannot apply).
        step: the training step of the advice.
        binding: what limits the data ("cores", "data NIC", "DNN NIC", "flow": the advice's
            ``binding``); reported only, the advised count already reflects it.
    """

    nodes: int
    advised_nodes: int | None
    data_wait_share: float
    node_rate: float | None = None
    node_usd_per_hour: float | None = None
    step: int = 0
    binding: str = "cores"

    @classmethod
    def from_advice(cls, advice: Mapping[str, Any]) -> "Demand":
        """The figures of one ``launcher.advice.model.Advice.to_dict()`` (or an advice line's dict)."""
        change = advice.get("change")
        nodes = int(advice.get("data_nodes") or 0)
        return cls(nodes=nodes, advised_nodes=None if change is None else nodes + int(change),
                   data_wait_share=float(advice.get("data_wait_fraction") or 0.0),
                   node_rate=advice.get("node_capacity_per_s"), node_usd_per_hour=advice.get("node_usd_per_hour"),
                   step=int(advice.get("step") or 0), binding=str(advice.get("binding") or "cores"))


def priced(node_usd_per_hour: float | None) -> bool:
    """A usable $/h price: a finite number above 0 (0 or NaN would make any cap pay for anything)."""
    return isinstance(node_usd_per_hour, (int, float)) and math.isfinite(node_usd_per_hour) and node_usd_per_hour > 0


@dataclass(frozen=True)
class Limits:
    """What the autoscaler may do (see the module docstring)."""

    min_nodes: int = 1
    max_nodes: int = 8
    usd_per_hour: float = 0.0      # cap on the data nodes' $/h together (0: none)
    cooldown_s: float = 60.0
    in_after: int = 2              # advice windows in a row that say "fewer" before a drain
    out_wait_share: float = 0.10   # scale out only when the step waits on data at least this share
    in_wait_share: float = 0.05    # drain only when it waits at most this share
    join_timeout_s: float = 600.0  # a scale-out not joined by then is no longer counted as promised
    drain_timeout_s: float = 600.0  # drained nodes still serving by then are counted again

    def check(self) -> None:
        """Raises ValueError naming the setting and the fix."""
        if self.min_nodes < 0:
            raise ValueError(f"min_nodes={self.min_nodes} must be >= 0")
        if self.max_nodes < max(1, self.min_nodes):
            raise ValueError(f"max_nodes={self.max_nodes} must be >= min_nodes={self.min_nodes} and >= 1")
        if not (math.isfinite(self.usd_per_hour) and self.usd_per_hour >= 0):
            raise ValueError(f"usd_per_hour={self.usd_per_hour} must be a $/h cap >= 0 (0: no cap)")
        for name in ("cooldown_s", "join_timeout_s", "drain_timeout_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name}={getattr(self, name)} must be a finite number of seconds >= 0")
        if self.in_after < 1:
            raise ValueError(f"in_after={self.in_after} must be >= 1 advice window")
        for name in ("out_wait_share", "in_wait_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a share 0..1, e.g. 0.05 for 5 %")

    def cap_nodes(self, node_usd_per_hour: float | None) -> int | None:
        """The most nodes the $/h cap pays for (None: no cap, or no price to apply it with)."""
        if not self.usd_per_hour or node_usd_per_hour is None or not priced(node_usd_per_hour):
            return None
        return int(math.floor(self.usd_per_hour / node_usd_per_hour + 1e-9))

    def unpriced(self, node_usd_per_hour: float | None) -> bool:
        """A $/h cap is set but there is no price to apply it with."""
        return bool(self.usd_per_hour) and not priced(node_usd_per_hour)

    def check_group(self, nodes: int, node_usd_per_hour: float | None, instance_type: str = "") -> None:
        """The group the job starts with fits the cap, and a cap has a price to apply.

        Raises:
            ValueError: the group costs more than the cap (naming both), or a cap with no price
                for ``instance_type`` (naming the ``advice_prices`` hyperparameter to set).
        """
        if self.unpriced(node_usd_per_hour):
            kind = instance_type or "the data instance type"
            example = instance_type or "ml.c5.9xlarge"
            raise ValueError(f"usd_per_hour={self.usd_per_hour:g} needs the $/h price of {kind} (got "
                             f"{node_usd_per_hour!r}): set the advice_prices hyperparameter, e.g. "
                             f"advice_prices='{{\"{example}\": 1.836}}', or drop the cap (usd_per_hour=0)")
        cap = self.cap_nodes(node_usd_per_hour)
        if cap is not None and nodes > cap:
            price = cast(float, node_usd_per_hour)  # a cap comes only with a usable price
            raise ValueError(f"usd_per_hour={self.usd_per_hour:g} pays for {cap} data node(s) at "
                             f"{price:g} $/h, the job starts with {nodes}: raise the cap to at least "
                             f"{nodes * price:g} or start fewer data nodes")


@dataclass(frozen=True)
class State:
    """What the policy carries from one decision to the next (persisted by the controller)."""

    last_action: str = ""              # OUT or IN, "" before the first
    last_action_at: float | None = None
    promised: int | None = None        # nodes the last scale-out aimed at, until they joined
    promised_at: float | None = None
    draining: int | None = None        # nodes the last drain aims at, until the drained ones left
    draining_at: float | None = None
    in_votes: int = 0                  # advice windows in a row that said "fewer"
    decisions: int = 0                 # actions taken (out or in)
    seen: int | None = None            # nodes serving at the last decision

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "State":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class Decision:
    """What to do: ``action`` OUT / IN / HOLD ``count`` nodes, from ``nodes`` to ``target``."""

    action: str
    count: int
    nodes: int
    target: int
    reason: str
    demand: Demand
    cap_nodes: int | None = None

    def figures(self) -> dict[str, Any]:
        """The decision and every figure it used, flat (for logs and metrics.json)."""
        d = self.demand
        return {"action": self.action, "count": self.count, "nodes": self.nodes, "target": self.target,
                "reason": self.reason, "advised_nodes": d.advised_nodes, "data_wait_share": d.data_wait_share,
                "node_rate": d.node_rate, "node_usd_per_hour": d.node_usd_per_hour, "step": d.step,
                "binding": d.binding, "cap_nodes": self.cap_nodes}


def _in_progress(state: State, nodes: int, limits: Limits, now: float) -> tuple[int | None, int | None]:
    """The scale-out (nodes promised) and the drain (nodes aimed at) still under way at ``now``."""
    promised, draining = state.promised, state.draining
    if promised is not None:
        if state.seen is not None and nodes < state.seen and state.draining is None:
            # with no drain under way, serving nodes that went (a Spot interruption) are nodes
            # lost: the promise would otherwise wait out join_timeout_s for them as if joining
            promised -= state.seen - nodes
        since = 0.0 if state.promised_at is None else now - state.promised_at
        if nodes >= promised or since > limits.join_timeout_s:
            promised = None  # joined, or given up on
    if draining is not None:
        since = 0.0 if state.draining_at is None else now - state.draining_at
        if nodes <= draining or since > limits.drain_timeout_s:
            draining = None  # left, or given up on: what still serves counts again
    return promised, draining


def decide(demand: Demand, limits: Limits, state: State, now: float) -> tuple[Decision, State]:
    """The decision for ``demand`` at ``now`` (seconds, any clock the caller keeps), and the next state."""
    nodes = demand.nodes
    promised, draining = _in_progress(state, nodes, limits, now)
    # drained nodes finishing what they owe still show in the count; they are gone already
    live = nodes if draining is None else min(nodes, draining)
    have = max(live, promised or 0)
    cap = limits.cap_nodes(demand.node_usd_per_hour)
    unpriced = limits.unpriced(demand.node_usd_per_hour)
    if unpriced:  # what the cap pays for is unknown: never more than the job has
        top = min(limits.max_nodes, have)
    else:
        top = limits.max_nodes if cap is None else min(limits.max_nodes, cap)
    floor_ = min(limits.min_nodes, top)
    carried = replace(state, promised=promised, promised_at=None if promised is None else state.promised_at,
                      draining=draining, draining_at=None if draining is None else state.draining_at, seen=nodes)

    def out(target: int, reason: str) -> tuple[Decision, State]:
        return (Decision(OUT, target - have, nodes, target, reason, demand, cap),
                replace(carried, last_action=OUT, last_action_at=now, promised=target, promised_at=now, in_votes=0,
                        decisions=state.decisions + 1))

    def drain(target: int, reason: str) -> tuple[Decision, State]:
        return (Decision(IN, live - target, nodes, target, reason, demand, cap),
                replace(carried, last_action=IN, last_action_at=now, promised=None, promised_at=None,
                        draining=target, draining_at=now, in_votes=0, decisions=state.decisions + 1))

    def hold(reason: str, target: int = have, votes: int = 0) -> tuple[Decision, State]:
        return Decision(HOLD, 0, nodes, target, reason, demand, cap), replace(carried, in_votes=votes)

    # limits first: they hold whatever the advice and the cooldown say
    if have < floor_:
        return out(floor_, f"below min_nodes={limits.min_nodes}")
    if live > top:
        why = f"above max_nodes={limits.max_nodes}" if top == limits.max_nodes else \
            f"above the {cap} node(s) usd_per_hour={limits.usd_per_hour:g} pays for"
        return drain(top, why)
    if demand.advised_nodes is None:
        return hold("no advice (no data node delivered a batch in the window)")
    if unpriced and demand.advised_nodes > have:
        return hold(f"advice {demand.advised_nodes} nodes but the data nodes have no $/h price, so the "
                    f"usd_per_hour={limits.usd_per_hour:g} cap cannot be applied: set the advice_prices "
                    "hyperparameter for the data instance type")
    target = max(floor_, min(top, demand.advised_nodes))
    since = math.inf if state.last_action_at is None else now - state.last_action_at
    if target > have:
        if draining is not None:
            return hold(f"waiting for {nodes - draining} drained node(s) to leave", target)
        if demand.data_wait_share < limits.out_wait_share:
            return hold(f"advice {demand.advised_nodes} nodes but the step waits only "
                        f"{100 * demand.data_wait_share:.0f}% on data (out_wait_share={limits.out_wait_share:g})",
                        target)
        if since < limits.cooldown_s:
            return hold(f"cooling down ({since:.0f} of {limits.cooldown_s:g} s since the last action)", target)
        return out(target, f"waits {100 * demand.data_wait_share:.0f}% on data; advice {demand.advised_nodes} nodes")
    if target < live and promised is None:
        votes = state.in_votes + 1
        if demand.data_wait_share > limits.in_wait_share:
            return hold(f"advice {demand.advised_nodes} nodes but the step waits {100 * demand.data_wait_share:.0f}% "
                        f"on data (in_wait_share={limits.in_wait_share:g})", target)
        if votes < limits.in_after:
            return hold(f"advice {demand.advised_nodes} nodes in {votes} of {limits.in_after} windows", target, votes)
        wait = 2 * limits.cooldown_s if state.last_action == OUT else limits.cooldown_s
        if since < wait:
            return hold(f"cooling down ({since:.0f} of {wait:g} s since the last action)", target, votes)
        return drain(target, f"advice {demand.advised_nodes} nodes in {votes} windows in a row; waits "
                             f"{100 * demand.data_wait_share:.0f}% on data")
    if promised is not None and target <= have:
        return hold(f"waiting for {promised - nodes} node(s) to join", promised)
    if draining is not None:
        return hold(f"waiting for {nodes - draining} drained node(s) to leave", draining)
    return hold("at the advised size" if target == live else "within the limits' reach", target)
