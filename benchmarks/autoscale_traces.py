"""Demand traces replayed through the real autoscaler: $ against the best fixed size, convergence, flaps, breaches.

    python -m benchmarks.autoscale_traces [--trace NAME ...] [--json PATH]

Each trace is a demand (the batches/s the ranks take, as their compute time per step sets it)
over simulated hours. Every advice window (60 s of simulated time) the live advice model
(``launcher.advice.model.advise``) is given what the ranks would measure with the data nodes
actually serving: the step time, the wait on data, each server's batches/s and busy share. Its
advice goes to the real controller (``launcher.autoscale.Autoscaler``, its real policy and a
``StateStore`` in a temporary registry folder), which acts through :class:`Fleet`: simulated
nodes that are paid from their start, serve after a join delay, leave a drain delay after
they are drained, and can vanish at once (a Spot interruption) or never register. The clock is
simulated too (no sleeping): the six traces, 36 simulated hours, replay in a few seconds.

For each trace: the $ paid for the data nodes against the best fixed size in hindsight (the
cheapest constant count meeting the demand at every window, clamped to ``max`` and to the
fewest nodes the $/h cap paid for over the trace: the closest when none meets it), the time
from each change of the demand, the price or the fleet until the serving count is within the
band the policy settles in (no wait that makes it add, no headroom that makes it drain) for
good, the flaps (an out followed by an in, or an in by an out, within :data:`FLAP_S`), and the
breaches: an action aiming above ``max`` or the cap, more nodes paid than ``max``, fewer
serving than ``min``, or the $/h paid above the cap once the controller had a window and a
drain to react (a price rise or an interruption it has not seen yet is no breach). It exits 1
on any breach or a change it never converged after.
"""
from __future__ import annotations

import logging
import math
import random
import statistics
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Sequence

from benchmarks.common import cli, report
from launcher.advice.model import LiveFigures, ServerFigures, advise
from launcher.autoscale import Autoscaler, Settings
from launcher.autoscale.actuators import ScaleContext
from launcher.autoscale.policy import HOLD, IN, OUT, Limits

TOKEN = "autoscale-traces-token"
INSTANCE = "ml.c5.9xlarge"
NODE_RATE = 20.0     # batches/s one data node builds
RANKS = 8
PRICE = 0.5          # $/h of one data node unless the trace changes it
WINDOW_S = 60.0      # one advice window (advice_every steps) of simulated time
TICK_S = 10.0        # the fleet is sampled (and paid) at this resolution between windows
JOIN_S = 120.0       # a started node serves this long after its start
LEAVE_S = 30.0       # a drained node finishes what it owes and leaves within this
GHOST_S = 300.0      # a node that never registers is paid this long before its start gives up
FLAP_S = 600.0       # an out and an in (either order) closer than this are a flap
LIMITS = {"min": 1, "max": 8, "usd_per_hour": 6.0}  # the cap pays for 12 nodes at PRICE: binding only on a price rise


@dataclass
class Trace:
    """One demand trace (times in seconds of simulated time).

    Args:
        need: batches/s the ranks take at ``t`` (their mean: ``noise`` varies each window around it).
        changes: times the demand, the price or the fleet changes (0 included): convergence is
            measured from each.
        start_nodes: data nodes serving at 0 (one of them the job's own, never drained).
        price: $/h of one data node at ``t``.
        noise: relative standard deviation of each window's demand around ``need``.
        interrupts: time -> joined nodes that vanish at once then.
        joins_fail: nodes started within this interval never register.
    """

    name: str
    what: str
    hours: float
    need: Callable[[float], float]
    changes: list[float]
    start_nodes: int = 2
    price: Callable[[float], float] = lambda t: PRICE
    noise: float = 0.0
    interrupts: dict[float, int] = field(default_factory=dict)
    joins_fail: tuple[float, float] | None = None
    limits: dict = field(default_factory=lambda: dict(LIMITS))


def _steps(levels: Sequence[tuple[float, float]]) -> Callable[[float], float]:
    """A demand that holds each ``(from_s, batches/s)`` level until the next one's start."""
    def need(t: float) -> float:
        return next(v for start, v in reversed(levels) if t >= start)
    return need


def traces() -> list[Trace]:
    """The replayed traces (see the module docstring)."""
    minute, hour = 60.0, 3600.0
    diurnal = [(h * hour, 70.0 + 50.0 * math.sin(2 * math.pi * (h - 6) / 24)) for h in range(24)]
    price = _steps([(0.0, PRICE), (30 * minute, 1.25), (90 * minute, PRICE)])
    return [
        Trace("step", "step time shortens (40 -> 110 batches/s), then lengthens (-> 50)", 2.5,
              _steps([(0.0, 40.0), (30 * minute, 110.0), (90 * minute, 50.0)]), [0.0, 30 * minute, 90 * minute]),
        Trace("diurnal", "hourly levels of a daily cycle, 20 to 120 batches/s", 24.0, _steps(diurnal),
              [t for t, _ in diurnal]),
        Trace("noisy", "70 batches/s with 10 % noise per window, from 2 nodes", 3.0, lambda t: 70.0, [0.0],
              noise=0.10),
        Trace("no join", "demand 40 -> 100 at 20 min; nodes started 20-40 min never register", 2.0,
              _steps([(0.0, 40.0), (20 * minute, 100.0)]), [0.0, 20 * minute], start_nodes=3,
              joins_fail=(20 * minute, 40 * minute)),
        Trace("spot", "100 batches/s; 3 joined nodes vanish at 30 min, 2 more at 31 min (while their "
              "replacements join), 2 at 90 min", 2.5, lambda t: 100.0, [0.0, 30 * minute, 90 * minute],
              start_nodes=6, interrupts={30 * minute: 3, 31 * minute: 2, 90 * minute: 2}),
        Trace("price", "100 batches/s under a 6 $/h cap; 0.5 -> 1.25 $/h at 30 min, back at 90 min", 2.5,
              lambda t: 100.0, [0.0, 30 * minute, 90 * minute], start_nodes=6, price=price),
    ]


class Clock:
    """Simulated seconds, advanced by the replay; the controller reads it as its clock."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        """The simulated time now."""
        return self.t


@dataclass
class Node:
    """One data node: paid from ``start``, serving from ``join`` (None: never), both until ``end``."""

    id: str
    own: bool
    start: float
    join: float | None
    end: float | None = None
    drained: bool = False

    def serving(self, t: float) -> bool:
        """It delivers batches at ``t`` (a drained node does until it leaves)."""
        return self.join is not None and self.join <= t and (self.end is None or t < self.end)

    def paid(self, t: float) -> bool:
        """It is paid for at ``t``: from its start, joined or not, until it ends."""
        return self.start <= t and (self.end is None or t < self.end)


class Fleet:
    """Simulated data nodes, and the actuator (``scale_out``, ``drain``) the controller acts through."""

    name = "simulated"

    def __init__(self, trace: Trace, clock: Clock) -> None:
        self.trace, self.clock = trace, clock
        self.nodes = [Node(f"node-{i}", i == 0, -JOIN_S, -JOIN_S + i * 1e-3) for i in range(trace.start_nodes)]

    def scale_out(self, count: int, ctx: ScaleContext) -> list[str]:
        """Start ``count`` nodes: serving after :data:`JOIN_S`, or never within the trace's ``joins_fail``."""
        now, fail = self.clock(), self.trace.joins_fail
        never = fail is not None and fail[0] <= now < fail[1]
        ids = []
        for _ in range(count):
            node = Node(f"node-{len(self.nodes)}", False, now, None if never else now + JOIN_S,
                        now + GHOST_S if never else None)
            self.nodes.append(node)
            ids.append(node.id)
        return ids

    def drain(self, count: int, ctx: ScaleContext) -> list[str]:
        """Drain the ``count`` newest joined nodes serving (never the job's own)."""
        now = self.clock()
        victims = sorted((n for n in self.nodes if n.serving(now) and not n.own and not n.drained),
                         key=lambda n: n.join, reverse=True)[:count]
        for n in victims:
            n.drained, n.end = True, now + LEAVE_S
        return [n.id for n in victims]

    def scale_in(self, drained, ctx: ScaleContext) -> None:
        pass  # drain() released them already

    def close(self) -> None:
        pass

    def interrupt(self, count: int, now: float) -> None:
        """``count`` of the newest joined nodes serving vanish at once (a Spot interruption)."""
        for n in sorted((n for n in self.nodes if n.serving(now) and not n.own and not n.drained),
                        key=lambda n: n.join, reverse=True)[:count]:
            n.end = now

    def serving(self, t: float) -> int:
        """Nodes delivering at ``t``: the count the advice sees."""
        return sum(n.serving(t) for n in self.nodes)

    def paid(self, t: float) -> int:
        """Nodes paid for at ``t``, joining and never-joining ones included."""
        return sum(n.paid(t) for n in self.nodes)


def advice_for(serving: int, need: float, price: float, step: int) -> dict:
    """The live advice of one window: what the ranks measure with ``serving`` nodes and a demand of
    ``need`` batches/s, through the real advice model."""
    if serving == 0:  # no server delivered anything: the advice cannot size a node
        return {"step": step, "data_nodes": 0, "change": None, "data_wait_fraction": 1.0, "node_usd_per_hour": price}
    capacity = serving * NODE_RATE
    compute = RANKS / need
    step_s = max(compute, RANKS / capacity)
    delivered = min(need, capacity)
    servers = tuple(ServerFigures(f"10.0.0.{i}:6000", delivered / serving, delivered / capacity)
                    for i in range(serving))
    figures = LiveFigures(step_s, step_s - compute, RANKS, servers, data_instance=INSTANCE)
    return dict(advise(figures, {INSTANCE: price}).to_dict(), step=step)


def band(need: float, limits: Limits, price: float) -> tuple[int, int]:
    """Serving counts the policy settles in for ``need``: enough that the wait stays below
    ``out_wait_share``, few enough that the advice's headroom drops none, within the limits."""
    cap = limits.cap_nodes(price)
    top = limits.max_nodes if cap is None else min(limits.max_nodes, cap)
    low = math.floor((1 - limits.out_wait_share) * need / NODE_RATE + 1e-9) + 1
    high = math.ceil(need * 1.1 / NODE_RATE - 1e-9)
    floor_ = min(limits.min_nodes, top)
    return max(floor_, min(top, low)), max(floor_, min(top, high))


@dataclass
class Tally:
    """What one replay saw, tick by tick and decision by decision."""

    usd: float = 0.0
    fixed_hours_usd: float = 0.0         # $ of one node over the trace (times the fixed size below)
    fixed_need: int = 0                  # nodes meeting the largest demand of any window
    cap_floor: int | None = None         # the fewest nodes the cap paid for over the trace (None: no cap)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (t, serving)
    actions: list[tuple[float, str, int]] = field(default_factory=list)  # (t, action, target)
    breaches: dict[str, int] = field(default_factory=lambda: {"aim": 0, "max": 0, "min": 0, "cap": 0})
    waiting: int = 0                     # windows the step waited at least out_wait_share on data
    windows: int = 0
    idle_node_h: float = 0.0             # node-hours paid while not serving (joining, never joined)


def replay(trace: Trace, limits_given: dict | None = None) -> dict:
    """Replay ``trace`` through the real controller; its figures. ``limits_given``: the ``autoscale.*``
    limits the controller is given when they differ from the trace's (a wrong limit shows as breaches)."""
    clock, rng, tally = Clock(), random.Random(f"autoscale-traces-{trace.name}"), Tally()
    fleet = Fleet(trace, clock)
    limits = Settings.from_options(trace.limits).limits
    with tempfile.TemporaryDirectory(prefix="autoscale-traces-") as registry:
        settings = Settings.from_options({"mode": "act", "actuator": "command", "scale_out_cmd": "simulated",
                                          **(limits_given or trace.limits)}, registry=registry)
        scaler = Autoscaler(settings, fleet, registry, TOKEN, clock=clock, drain_by_actuator=True)
        try:
            for k in range(int(trace.hours * 3600 / TICK_S)):
                clock.t = k * TICK_S
                _tick(trace, fleet, scaler, limits, rng, tally, clock.t)
        finally:
            scaler.close()
    return summarize(trace, limits, tally)


def _tick(trace: Trace, fleet: Fleet, scaler: Autoscaler, limits: Limits, rng: random.Random, tally: Tally,
          t: float) -> None:
    """One tick: interruptions due, the advice and the decision on a window's edge, then what is paid."""
    if t in trace.interrupts:
        fleet.interrupt(trace.interrupts[t], t)
    price = trace.price(t)
    if t % WINDOW_S == 0:
        need = max(1e-3, trace.need(t) * (1 + trace.noise * rng.gauss(0, 1)))
        serving = fleet.serving(t)
        figures = scaler.on_advice(advice_for(serving, need, price, int(t / WINDOW_S) * 100))
        scaler.wait()
        tally.windows += 1
        tally.waiting += serving * NODE_RATE <= (1 - limits.out_wait_share) * need
        tally.fixed_need = max(tally.fixed_need, math.ceil(need / NODE_RATE - 1e-9))
        if figures and figures["action"] != HOLD:
            tally.actions.append((t, figures["action"], figures["target"]))
            cap = limits.cap_nodes(price)
            target = figures["target"]
            tally.breaches["aim"] += target > limits.max_nodes or (cap is not None and target > cap)
    cap = limits.cap_nodes(price)
    if cap is not None:
        tally.cap_floor = cap if tally.cap_floor is None else min(tally.cap_floor, cap)
    serving, paid = fleet.serving(t), fleet.paid(t)
    tally.samples.append((t, serving))
    tally.usd += paid * price * TICK_S / 3600
    tally.fixed_hours_usd += price * TICK_S / 3600
    tally.idle_node_h += (paid - serving) * TICK_S / 3600 if paid > serving else 0.0
    tally.breaches["max"] += paid > limits.max_nodes
    # what the controller cannot have seen yet: a change within one window and a drain (a lost
    # node: and a replacement's join); the interruptions are changes too
    since = min((t - c for c in [*trace.changes, *trace.interrupts] if c <= t), default=math.inf)
    settling = 0 < t and since < WINDOW_S + LEAVE_S + JOIN_S
    tally.breaches["min"] += serving < limits.min_nodes and not settling
    tally.breaches["cap"] += bool(limits.usd_per_hour) and paid * price > limits.usd_per_hour + 1e-9 \
        and since >= WINDOW_S + LEAVE_S + TICK_S


def converge_times(trace: Trace, limits: Limits, samples: list[tuple[float, int]]) -> list[float | None]:
    """For each change: seconds until the serving count is in the settling band for good (None: never)."""
    out = []
    ends = trace.changes[1:] + [trace.hours * 3600]
    for start, end in zip(trace.changes, ends):
        low, high = band(trace.need(start), limits, trace.price(start))
        phase = [(t, n) for t, n in samples if start <= t < end]
        settled = None
        for t, n in reversed(phase):
            if not low <= n <= high:
                break
            settled = t
        out.append(None if settled is None else settled - start)
    return out


def flaps(actions: list[tuple[float, str, int]]) -> int:
    """Out then in, or in then out, within :data:`FLAP_S`."""
    return sum(1 for (t0, a, _), (t1, b, _) in zip(actions, actions[1:]) if a != b and t1 - t0 < FLAP_S)


def summarize(trace: Trace, limits: Limits, tally: Tally) -> dict:
    """One trace's row: $, the fixed size, convergence, flaps, actions and breaches."""
    fixed = max(limits.min_nodes, min(tally.fixed_need, limits.max_nodes, tally.cap_floor or limits.max_nodes))
    fixed_usd = fixed * tally.fixed_hours_usd
    converge = converge_times(trace, limits, tally.samples)
    return {"trace": trace.name, "what": trace.what, "hours": trace.hours, "usd": round(tally.usd, 3),
            "fixed_nodes": fixed, "fixed_meets": fixed >= tally.fixed_need, "fixed_usd": round(fixed_usd, 3),
            "usd_vs_fixed": round(tally.usd / fixed_usd, 3) if fixed_usd else None,
            "converge_s": converge, "converged": all(c is not None for c in converge),
            "flaps": flaps(tally.actions), "outs": sum(a == OUT for _, a, _ in tally.actions),
            "ins": sum(a == IN for _, a, _ in tally.actions),
            "waiting_share": round(tally.waiting / max(1, tally.windows), 3),
            "idle_node_h": round(tally.idle_node_h, 2), "breaches": dict(tally.breaches),
            "breach_total": sum(tally.breaches.values())}


def _converge_text(times: list[float | None]) -> str:
    """Each change's time, or the longest and the median of many; "-" for a change never converged after."""
    if any(t is None for t in times):
        return "never: " + ", ".join("-" if t is None else f"{t:.0f}" for t in times)
    if len(times) > 4:
        return f"max {max(times):.0f}, median {statistics.median(times):.0f} of {len(times)}"
    return ", ".join(f"{t:.0f}" for t in times)


def table(rows: list[dict]) -> str:
    """The rows as one markdown table."""
    lines = ["| trace | h | $ paid | best fixed: nodes, $ | paid / fixed | converge s after each change | "
             f"flaps ({FLAP_S:.0f} s) | outs / ins | windows waiting >= 10 % | node-h paid not serving | "
             "breaches aim/max/min/cap |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["breaches"]
        fixed = f"{r['fixed_nodes']}{'' if r['fixed_meets'] else ' (closest)'}, {r['fixed_usd']:.2f}"
        lines.append(f"| {r['trace']} | {r['hours']:g} | {r['usd']:.2f} | {fixed} | {r['usd_vs_fixed']:.2f} | "
                     f"{_converge_text(r['converge_s'])} | {r['flaps']} | {r['outs']} / {r['ins']} | "
                     f"{100 * r['waiting_share']:.0f} % | {r['idle_node_h']:.2f} | "
                     f"{b['aim']}/{b['max']}/{b['min']}/{b['cap']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Replay the traces, print the stamp and the table, write ``--json``; 1 on a breach or no convergence."""
    ap = cli.parser(__doc__, prog="python -m benchmarks.autoscale_traces")
    ap.add_argument("--trace", action="append", choices=[t.name for t in traces()],
                    help="replay only this trace (repeatable; default: all)")
    cli.add_json(ap)
    args = ap.parse_args(argv)
    logging.getLogger("launcher.autoscale").setLevel(logging.WARNING)  # one line per decision otherwise
    rows = [replay(t) for t in traces() if not args.trace or t.name in args.trace]
    print(f"{report.command('python -m benchmarks.autoscale_traces', argv)}\n{report.stamp()}")
    print(f"node {NODE_RATE:g} batches/s, {RANKS} ranks, advice every {WINDOW_S:g} s, join {JOIN_S:g} s, "
          f"leave {LEAVE_S:g} s, a node that never registers paid {GHOST_S:g} s; limits {LIMITS}, policy defaults "
          f"otherwise (cooldown 60 s, in_after 2, join/drain timeout 600 s)")
    print(table(rows))
    for r in rows:
        print(f"  {r['trace']}: {r['what']}")
    report.write_json(args.json, {"stamp": report.stamp(), "rows": rows})
    bad = [r["trace"] for r in rows if r["breach_total"] or not r["converged"]]
    if bad:
        print(f"FAILED: breaches or no convergence in {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
