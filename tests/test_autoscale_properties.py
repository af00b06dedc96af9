"""Properties of the autoscaler's policy (``launcher.autoscale.policy.decide``) over generated
limits, states, advice and clusters whose nodes join and leave late or never.

The simulated cluster: a scale-out's nodes join after a delay (or never), a drain's nodes leave
after a delay (or never); the policy reads the count once per advice window.
"""
from __future__ import annotations

import itertools
import math

from hypothesis import event, given, settings
from hypothesis import strategies as st

from launcher.autoscale.policy import HOLD, IN, OUT, Demand, Limits, State, decide

FAST = settings(deadline=None, max_examples=300)
SIMS = settings(deadline=None, max_examples=120)

prices = st.one_of(st.none(), st.sampled_from([0.25, 0.5, 1.0, 1.836, 3.06]))


@st.composite
def limits(draw, timeouts=st.floats(0, 900)) -> Limits:
    low = draw(st.integers(0, 4))
    return Limits(min_nodes=low, max_nodes=draw(st.integers(max(1, low), 10)),
                  usd_per_hour=draw(st.sampled_from([0.0, 0.0, 1.0, 2.5, 6.0, 20.0])),
                  cooldown_s=draw(st.sampled_from([0.0, 30.0, 60.0, 300.0])), in_after=draw(st.integers(1, 3)),
                  out_wait_share=draw(st.floats(0.0, 0.3)), in_wait_share=draw(st.floats(0.0, 0.1)),
                  join_timeout_s=draw(timeouts), drain_timeout_s=draw(timeouts))


def optional_int(low: int, high: int):
    return st.one_of(st.none(), st.integers(low, high))


@st.composite
def states(draw) -> State:
    when = st.one_of(st.none(), st.floats(0, 2000))
    return State(last_action=draw(st.sampled_from(["", OUT, IN])), last_action_at=draw(when),
                 promised=draw(optional_int(0, 12)), promised_at=draw(when), draining=draw(optional_int(0, 12)),
                 draining_at=draw(when), in_votes=draw(st.integers(0, 3)), decisions=draw(st.integers(0, 5)))


demands = st.builds(Demand, nodes=st.integers(0, 14), advised_nodes=optional_int(0, 20),
                    data_wait_share=st.floats(0, 1), node_usd_per_hour=prices)


def ceiling(lim: Limits, price: float | None) -> int:
    """The most nodes an action may aim at: max_nodes and what the cap pays for."""
    cap = lim.cap_nodes(price)
    return lim.max_nodes if cap is None else min(lim.max_nodes, cap)


@FAST
@given(limits(), demands, states(), st.floats(0, 3000))
def test_an_action_never_aims_above_max_or_the_cap_nor_below_min_unless_the_cap_forbids(lim, demand, state, now):
    dec, after = decide(demand, lim, state, now)
    top = ceiling(lim, demand.node_usd_per_hour)
    event(f"action {dec.action}")
    if dec.action == HOLD:
        assert dec.count == 0 and after.decisions == state.decisions
        return
    assert dec.count > 0 and after.decisions == state.decisions + 1
    assert dec.target <= top, dec
    assert dec.target >= min(lim.min_nodes, top), dec
    if dec.action == OUT:
        assert not lim.unpriced(demand.node_usd_per_hour), dec  # no price under a cap: never grow
        assert after.promised == dec.target
    else:
        assert after.draining == dec.target and after.promised is None


@FAST
@given(limits(), st.integers(0, 14), prices, st.floats(0, 1))
def test_a_fresh_group_below_min_grows_to_it_when_the_cap_allows(lim, nodes, price, wait):
    dec, _ = decide(Demand(nodes, None, wait, node_usd_per_hour=price), lim, State(), 0.0)
    floor_ = min(lim.min_nodes, ceiling(lim, price))
    if nodes < floor_ and not lim.unpriced(price):
        assert (dec.action, dec.target) == (OUT, floor_), dec
    elif dec.action == IN:
        assert nodes > ceiling(lim, price) and dec.target == ceiling(lim, price)


class Cluster:
    """Nodes that join and leave at the times the draws give (None: never)."""

    def __init__(self, nodes: int, delays: list[float | None]) -> None:
        self.nodes, self.delays, self.events = nodes, iter(delays), []  # events: (time, +1 / -1)

    def _delay(self) -> float | None:
        return next(self.delays, 0.0)

    def act(self, dec, now: float) -> None:
        for _ in range(dec.count):
            delay = self._delay()
            if delay is not None:
                self.events.append((now + delay, 1 if dec.action == OUT else -1))

    def count(self, now: float) -> int:
        due = [e for e in self.events if e[0] <= now]
        self.events = [e for e in self.events if e[0] > now]
        self.nodes += sum(e[1] for e in due)
        return self.nodes


def run(lim, price, nodes, advice, delays, window):
    """Decide once per window on ``advice`` ((advised, wait) per window); the actions with their time."""
    cluster, state, actions, seen = Cluster(nodes, delays), State(), [], []
    for i, (advised, wait) in enumerate(advice):
        now = i * window
        dec, state = decide(Demand(cluster.count(now), advised, wait, node_usd_per_hour=price), lim, state, now)
        cluster.act(dec, now)
        seen.append((now, dec, state))
        if dec.action != HOLD:
            actions.append((now, dec))
    return actions, seen, cluster


soon = st.floats(0, 120)
late = st.floats(0, 130).map(lambda s: None if s > 120 else s)  # about one node in thirteen never joins or leaves
# shares either side of the out and in thresholds, so the advice both adds and drains
waits = st.sampled_from([0.0, 0.01, 0.04, 0.08, 0.2, 0.6])
# the advice in stretches of a few windows alike, as a job's phases give it
advised = st.integers(0, 14).map(lambda n: None if n == 14 else n)  # 14: no advice in the window
# a demand swinging between more nodes (waiting on data) and fewer (not waiting): the flapping case
swings = st.lists(st.tuples(st.integers(0, 13), st.integers(0, 13), st.integers(1, 8)), min_size=1, max_size=6).map(
    lambda runs: [w for hi, lo, n in runs for w in [(max(hi, lo), 0.6)] * n + [(min(hi, lo), 0.0)] * n])
sim_prices = st.sampled_from([0.5, 1.0, 1.836, 3.06, None])
phases = st.lists(st.tuples(advised, waits, st.integers(1, 8)), min_size=2, max_size=12).map(
    lambda runs: [(advised, wait) for advised, wait, n in runs for _ in range(n)])


@SIMS
@given(limits(timeouts=st.floats(150, 900)), sim_prices, st.integers(0, 12),
       st.one_of(phases, swings), st.lists(late, max_size=60), st.sampled_from([5.0, 10.0, 30.0, 60.0]))
def test_no_reversal_within_the_cooldown(lim, price, nodes, advice, delays, window):
    """Out then in, or in then out, never within ``cooldown_s`` (out then in: twice that, unless the
    group is above a limit), whatever the advice says and however late the nodes join or leave."""
    actions, _, _ = run(lim, price, nodes, advice, delays, window)
    event(f"reversals {sum(a[1].action != b[1].action for a, b in zip(actions, actions[1:])) > 0}")
    for (t0, a), (t1, b) in zip(actions, actions[1:]):
        if a.action != b.action:
            assert t1 - t0 >= lim.cooldown_s, (a, b)
        if a.action == OUT and b.action == IN and "above" not in b.reason:
            assert t1 - t0 >= 2 * lim.cooldown_s, (a, b)


def converge_within(lim: Limits, window: float, longest: float) -> int:
    """The windows a stationary demand takes at most: the drain's votes, one cooldown and the
    slowest join or leave, and three windows for the reads that see each step land."""
    return lim.in_after + math.ceil((lim.cooldown_s + longest) / window) + 3


@SIMS
@given(limits(timeouts=st.just(900.0)), prices, st.integers(0, 12), st.integers(0, 14),
       st.lists(st.floats(0, 120), max_size=40), st.sampled_from([10.0, 30.0, 60.0]))
def test_a_stationary_demand_converges_within_the_stated_windows_and_stays(lim, price, nodes, demand, delays,
                                                                         window):
    """The advice says ``demand`` nodes every window (waiting on data while short of them); the
    group reaches ``demand`` clamped to the limits within :func:`converge_within` windows."""
    if lim.unpriced(price):
        price = 1.0  # without a price the group holds where it is: covered by the first property
    top = ceiling(lim, price)
    goal = max(min(lim.min_nodes, top), min(top, demand))
    bound = converge_within(lim, window, 120.0)
    cluster, state = Cluster(nodes, delays), State()
    for i in range(bound + 10):
        now = i * window
        have = cluster.count(now)
        dec, state = decide(Demand(have, demand, 0.5 if have < demand else 0.0, node_usd_per_hour=price), lim,
                            state, now)
        cluster.act(dec, now)
        if dec.action != HOLD:
            event(f"converged after an {dec.action}")
        if i >= bound:
            assert have == goal and dec.action == HOLD, (i, have, goal, dec)


@SIMS
@given(limits(), sim_prices, st.integers(0, 12),
       phases, st.sampled_from([5.0, 30.0, 120.0]))
def test_an_action_under_way_is_remembered_until_it_lands_or_times_out(lim, price, nodes, advice, window):
    """Nobody joins or leaves: after a scale-out its nodes stay promised (no second out for them)
    until ``join_timeout_s``, after a drain its nodes stay gone (no second drain of the same nodes)
    until ``drain_timeout_s``; then they are forgotten."""
    # Never: as many as the run asks for (a finite list would run out and let nodes go at once).
    _, seen, _ = run(lim, price, nodes, advice, itertools.repeat(None), window)
    last = None  # (time, decision) of the latest action
    for now, dec, state in seen:
        if last is not None:
            within = now - last[0] <= (lim.join_timeout_s if last[1].action == OUT else lim.drain_timeout_s)
            event(f"{last[1].action} then {dec.action} {'within' if within else 'after'} its timeout")
        if last is not None and dec.action == HOLD:
            t0, act = last
            if act.action == OUT:
                timeout = lim.join_timeout_s
                assert state.promised == (act.target if now - t0 <= timeout else None), (act, dec, state)
            else:
                timeout = lim.drain_timeout_s
                assert state.draining == (act.target if now - t0 <= timeout else None), (act, dec, state)
        if last is not None and dec.action == last[1].action and now - last[0] <= (
                lim.join_timeout_s if dec.action == OUT else lim.drain_timeout_s):
            # a second action the same way goes past the first one's target, never repeats it
            assert (dec.target > last[1].target) if dec.action == OUT else (dec.target < last[1].target), (last, dec)
        if dec.action != HOLD:
            last = (now, dec)


@FAST
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 1e6)), max_size=12), st.integers(0, 14), st.data())
def test_a_drain_never_picks_the_jobs_own_nodes_nor_one_already_drained(servers, count, data):
    """Whatever the registry lists, the victims are the newest servers that joined through it."""
    from unittest import mock

    from data_service.membership.registry import Entry
    from launcher.autoscale import Autoscaler, Settings

    entries = [Entry(f"10.0.0.{i}:6000", "fp", f"s{i}", started, "proof") for i, (_, started) in enumerate(servers)]
    own = {e.address for e, (is_own, _) in zip(entries, servers) if is_own}
    drained = data.draw(st.lists(st.sampled_from([e.server_id for e in entries]), unique=True) if entries
                        else st.just([]))
    scaler = Autoscaler(Settings.from_options({"mode": "advise"}), None, "", "token", fixed=sorted(own))
    scaler.drained = list(drained)
    with mock.patch("launcher.autoscale.controller.verified_entries", return_value=(entries, [])):
        chosen = scaler.victims(count)
    scaler.close(0.0)
    joined = [e for e in entries if e.address not in own and e.server_id not in drained]
    assert not {e.address for e in chosen} & own and not {e.server_id for e in chosen} & set(drained)
    assert len(chosen) == min(count, len(joined))
    newest = sorted(joined, key=lambda e: (e.started_at, e.server_id), reverse=True)[:count]
    assert chosen == newest
