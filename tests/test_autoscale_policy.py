"""The autoscaler's policy: table-driven decisions, limits, cooldown, hysteresis and no flapping."""
from __future__ import annotations

import pytest

from launcher.autoscale.policy import HOLD, IN, OUT, Demand, Limits, State, decide

L = Limits(min_nodes=1, max_nodes=6, usd_per_hour=0.0, cooldown_s=30, in_after=2)


def d(nodes, advised, wait=0.3, price=None):
    return Demand(nodes=nodes, advised_nodes=advised, data_wait_share=wait, node_rate=10.0, node_usd_per_hour=price)


@pytest.mark.parametrize("demand, limits, state, now, action, count, reason", [
    (d(1, 4), L, State(), 0, OUT, 3, "advice 4"),
    (d(1, 9), L, State(), 0, OUT, 5, "advice 9"),                                 # max_nodes
    (d(1, 9, price=0.5), Limits(max_nodes=8, usd_per_hour=2.0), State(), 0, OUT, 3, "advice 9"),  # $ cap: 4 nodes
    (d(1, 4, wait=0.01), L, State(), 0, HOLD, 0, "waits only 1%"),               # no wait: no scale-out
    (d(1, 4), L, State(last_action=IN, last_action_at=90), 100, HOLD, 0, "cooling down"),
    (d(1, 4), L, State(last_action=IN, last_action_at=60), 100, OUT, 3, ""),
    (d(2, 4), L, State(promised=4, promised_at=90), 100, HOLD, 0, "waiting for 2"),  # promised, not yet joined
    (d(2, 4), L, State(promised=4, promised_at=0), 1000, OUT, 2, ""),           # promise timed out
    (d(4, 2, wait=0.0), L, State(), 0, HOLD, 0, "1 of 2 windows"),               # hysteresis: one vote
    (d(4, 2, wait=0.0), L, State(in_votes=1), 0, IN, 2, "2 windows"),
    (d(4, 2, wait=0.2), L, State(in_votes=1), 0, HOLD, 0, "waits 20%"),          # still waiting: no drain
    (d(4, 0, wait=0.0), L, State(in_votes=1), 0, IN, 3, ""),                     # never below min
    (d(4, 2, wait=0.0), L, State(in_votes=1, last_action=OUT, last_action_at=50), 100, HOLD, 0, "60 s"),
    (d(0, None), L, State(), 0, OUT, 1, "below min_nodes"),
    (d(8, 8), L, State(last_action=OUT, last_action_at=99), 100, IN, 2, "above max_nodes"),
    (d(5, 5, price=1.0), Limits(max_nodes=8, usd_per_hour=3.0), State(), 0, IN, 2, "usd_per_hour=3"),
    (d(3, None), L, State(), 0, HOLD, 0, "no advice"),
    (d(3, 3), L, State(), 0, HOLD, 0, "at the advised size"),
])
def test_decisions(demand, limits, state, now, action, count, reason):
    decision, _ = decide(demand, limits, state, now)
    assert (decision.action, decision.count) == (action, count), decision
    assert reason in decision.reason
    assert decision.figures()["data_wait_share"] == demand.data_wait_share


def test_an_out_promises_the_nodes_and_counts_as_one_decision():
    dec, s = decide(d(1, 4), L, State(), 10)
    assert s.promised == 4 and s.last_action == OUT and s.decisions == 1
    dec, s = decide(d(3, 4), L, s, 20)  # two joined so far
    assert dec.action == HOLD and s.promised == 4
    dec, s = decide(d(4, 4), L, s, 30)
    assert dec.action == HOLD and s.promised is None and s.decisions == 1


def test_no_flapping_when_the_advice_swings_around_the_size():
    """The advice alternating one node above and below, with the wait it implies, never drains
    what it just added and takes at most one action per cooldown."""
    s, now, actions = State(), 0.0, []
    nodes = 3
    for i in range(40):
        advised, wait = (4, 0.08) if i % 2 else (2, 0.0)
        dec, s = decide(d(nodes, advised, wait), L, s, now)
        if dec.action == OUT:
            nodes += dec.count
        elif dec.action == IN:
            nodes -= dec.count
        if dec.action != HOLD:
            actions.append((now, dec.action))
        now += 10
    reversals = sum(1 for a, b in zip(actions, actions[1:]) if a[1] != b[1])
    assert all(b[0] - a[0] >= L.cooldown_s for a, b in zip(actions, actions[1:])), actions
    assert reversals <= len(actions) // 2 and not any(  # never in right after an out
        a[1] == OUT and b[1] == IN and b[0] - a[0] < 2 * L.cooldown_s for a, b in zip(actions, actions[1:]))


def test_a_steady_demand_converges_and_stays():
    s, nodes, now = State(), 1, 0.0
    log = []
    for _ in range(30):
        dec, s = decide(d(nodes, 4, 0.3 if nodes < 4 else 0.02), L, s, now)
        nodes += dec.count if dec.action == OUT else -dec.count if dec.action == IN else 0
        log.append(dec.action)
        now += 10
    assert nodes == 4 and log.count(OUT) == 1 and IN not in log


@pytest.mark.parametrize("limits, match", [
    (Limits(min_nodes=3, max_nodes=2), "max_nodes=2 must be >= min_nodes=3"),
    (Limits(min_nodes=-1), "min_nodes=-1"),
    (Limits(usd_per_hour=-1), "usd_per_hour=-1"),
    (Limits(cooldown_s=float("nan")), "cooldown_s=nan"),
    (Limits(drain_timeout_s=float("inf")), "drain_timeout_s=inf must be a finite number of seconds"),
    (Limits(in_after=0), "in_after=0"),
    (Limits(out_wait_share=5), "out_wait_share=5"),
])
def test_bad_limits_name_the_setting(limits, match):
    with pytest.raises(ValueError, match=match):
        limits.check()


def test_a_cap_below_the_starting_group_is_an_error():
    with pytest.raises(ValueError,
                       match=r"usd_per_hour=1 pays for 2 data node\(s\) at 0.5 \$/h, the job starts with 3"):
        Limits(usd_per_hour=1.0).check_group(3, 0.5)
    Limits(usd_per_hour=1.5).check_group(3, 0.5)
    with pytest.raises(ValueError, match=r"usd_per_hour=1 needs the \$/h price of ml.c5.9xlarge .*advice_prices"):
        Limits(usd_per_hour=1.0).check_group(3, None, "ml.c5.9xlarge")  # no price: the cap cannot apply
    Limits().check_group(3, None)  # no cap: no price needed


def test_demand_from_an_advice_dict_and_state_round_trip():
    demand = Demand.from_advice({"change": 3, "data_nodes": 2, "data_wait_fraction": 0.4, "node_capacity_per_s": 5.0,
                                 "node_usd_per_hour": 0.5, "step": 300})
    assert (demand.nodes, demand.advised_nodes, demand.step, demand.binding) == (2, 5, 300, "cores")
    assert Demand.from_advice({"change": None, "data_nodes": 2}).advised_nodes is None
    s = State(last_action=OUT, last_action_at=5.0, promised=3, promised_at=5.0, in_votes=0, decisions=1)
    assert State.from_dict(dict(s.to_dict(), unknown=1)) == s


def test_a_cap_without_a_price_never_grows_the_group():
    capped = Limits(min_nodes=3, max_nodes=8, usd_per_hour=1.0, cooldown_s=0)
    dec, s = decide(d(2, 8, wait=0.5), capped, State(), 0)
    assert (dec.action, dec.count, dec.target) == (HOLD, 0, 2) and "advice_prices" in dec.reason
    assert s.promised is None
    for price in (None, 0.0, float("nan")):  # below min_nodes too: what the cap pays for is unknown
        dec, _ = decide(d(1, None, price=price), capped, State(), 0)
        assert dec.action == HOLD, (price, dec)
    assert capped.cap_nodes(None) is None and capped.unpriced(None) and not Limits().unpriced(None)


def test_a_drain_in_progress_is_remembered_until_the_nodes_leave_or_it_times_out():
    capped = Limits(min_nodes=1, max_nodes=4, cooldown_s=30, drain_timeout_s=300)
    dec, s = decide(d(6, 6), capped, State(), 0)
    assert (dec.action, dec.count, s.draining) == (IN, 2, 4)
    for now, nodes in ((10, 6), (20, 5)):  # the drained ones still finishing what they owe
        dec, s = decide(d(nodes, 6), capped, s, now)
        assert (dec.action, dec.count, s.draining) == (HOLD, 0, 4), (now, dec)
        assert "to leave" in dec.reason
    dec, s = decide(d(4, 6), capped, s, 30)
    assert dec.action == HOLD and s.draining is None and s.decisions == 1
    dec, s = decide(d(6, 6), capped, State(draining=4, draining_at=0), 301)  # never left: counted again
    assert (dec.action, dec.count) == (IN, 2)


def test_no_scale_out_while_drained_nodes_are_leaving():
    dec, s = decide(d(5, 6), L, State(draining=3, draining_at=0, last_action=IN, last_action_at=0), 100)
    assert dec.action == HOLD and "2 drained node(s) to leave" in dec.reason and s.draining == 3
