"""The demand traces of ``benchmarks.autoscale_traces`` replayed through the real autoscaler: no
breach of min, max or the $/h cap, and the serving count settles after every change."""
from __future__ import annotations

import dataclasses

import pytest

from benchmarks import autoscale_traces as at
from launcher.autoscale.policy import HOLD, OUT, Demand, Limits, State, decide

TRACES = {t.name: t for t in at.traces()}


@pytest.fixture(scope="module")
def rows():
    return {name: at.replay(trace) for name, trace in TRACES.items()}


def test_at_least_six_traces_cover_the_cases():
    assert {"step", "diurnal", "noisy", "no join", "spot", "price"} <= set(TRACES)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_a_trace_breaches_no_limit_and_converges_after_each_change(rows, name):
    row = rows[name]
    assert row["breach_total"] == 0, row["breaches"]
    assert row["converged"], row["converge_s"]
    assert len(row["converge_s"]) == len(TRACES[name].changes)


def test_a_scale_out_that_never_joins_times_out_and_is_tried_once_per_join_timeout(rows):
    row, trace = rows["no join"], TRACES["no join"]
    start, end = trace.joins_fail
    # one try per join timeout while nothing registers, then the one that joins
    assert row["outs"] <= (end - start) // 600 + 2
    assert row["converge_s"][1] <= (end - start) + 600 + at.JOIN_S + 2 * at.WINDOW_S


def test_nodes_lost_while_a_scale_out_joins_are_replaced_without_waiting_out_the_join_timeout(rows):
    # the second interruption lands while the first one's replacements join
    assert rows["spot"]["converge_s"][1] <= 2 * at.JOIN_S + 2 * at.WINDOW_S


def test_a_promise_is_lowered_by_the_serving_nodes_lost_meanwhile():
    lim = Limits(min_nodes=1, max_nodes=8, cooldown_s=60)
    dec, s = decide(Demand(3, 6, 0.4), lim, State(), 0.0)
    assert (dec.action, s.promised) == (OUT, 6)
    dec, s = decide(Demand(1, 6, 0.6), lim, s, 60.0)  # two serving nodes vanished while three join
    assert (dec.action, dec.count, s.promised) == (OUT, 2, 6)
    dec, s = decide(Demand(4, 6, 0.3), lim, s, 120.0)  # the first three joined: two still to come
    assert dec.action == HOLD and s.promised == 6


def test_a_wrong_limit_given_to_the_controller_shows_as_breaches():
    # the trace's own max is 5; the controller is told the default 8 and the step trace asks for 7
    trace = dataclasses.replace(TRACES["step"], limits=dict(at.LIMITS, max=5))
    row = at.replay(trace, limits_given=dict(at.LIMITS))
    assert row["breaches"]["aim"] > 0 and row["breaches"]["max"] > 0


def test_the_table_prints_every_trace_and_the_run_passes(capsys):
    assert at.main(["--trace", "step", "--trace", "price"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("python -m benchmarks.autoscale_traces --trace step --trace price\n")
    assert "| step |" in out and "| price |" in out and "UTC" in out
