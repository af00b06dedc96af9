"""Live advice: the model with hand-computed figures, the advisor's windows, its lines and metrics.

Prices used below (hetero/planning/prices.json): ml.c5.9xlarge $1.836/h, ml.p3.2xlarge $3.825/h.
"""
import json
import logging
import re
import shutil
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.cli import main
from hetero.commands.stats import latest_advice
from hetero.planning.planner import predict_step
from launcher.advice.model import (MIN_OUT_WAIT, LiveFigures, ServerFigures, advise, layout_of, server_capacity,
                                   steps_per_epoch)
from launcher.advice.advisor import LiveAdvisor, Snapshot, window_figures
from launcher.metric_lines import METRIC_DEFINITIONS, advice_line
from launcher.train.step_stats import StepStats, StepTimer, job_metrics

PRICES = {"ml.c5.9xlarge": 1.836, "ml.p3.2xlarge": 3.825}


def figures(step, wait, ranks, servers, steps=1000):
    return LiveFigures(step, wait, ranks, tuple(servers), steps, "ml.c5.9xlarge", "ml.p3.2xlarge", 1)


def test_a_starved_job_is_told_how_many_nodes_remove_the_wait_and_what_they_cost():
    # step 40 ms of which 30 ms data wait: compute 10 ms; one node delivers 25 batches/s (all it can)
    a = advise(figures(0.040, 0.030, 1, [ServerFigures("d1:6000", 25.0, 1.0)]), PRICES)
    # needed: 1 x 1.1 / 0.010 = 110 batches/s (10 % headroom); (110 - 25) / 25 = 3.4 -> 4 more nodes
    assert a.change == 4 and a.data_nodes == 1
    assert a.compute_s == pytest.approx(0.010) and a.data_wait_fraction == pytest.approx(0.75)
    assert a.predicted_step_s == pytest.approx(0.010)       # max(0.010, 1 / 125)
    assert a.change_usd_per_hour == pytest.approx(4 * 1.836)
    assert a.change_usd_per_epoch == pytest.approx(7.344 * 1000 * 0.010 / 3600)   # 0.0204
    assert a.job_usd_per_epoch == pytest.approx(5.661 * 1000 * 0.040 / 3600)      # 0.0629
    assert a.predicted_job_usd_per_epoch == pytest.approx(13.005 * 1000 * 0.010 / 3600)  # 0.0361


def test_an_oversized_data_group_is_told_how_many_nodes_could_go_and_the_saving():
    # 2 ranks, 50 ms compute, no wait; 4 nodes each deliver 10 batches/s at 25% busy: 40 possible each
    servers = [ServerFigures(f"d{i}:6000", 10.0, 0.25) for i in range(4)]
    a = advise(figures(0.050, 0.0, 2, servers), PRICES)
    # needed 2 x 1.1 / 0.05 = 44; capacity 160; (160 - 44) / 40 = 2.9 -> 2 could go
    assert a.change == -2 and a.capacity_per_s == pytest.approx(160.0) and a.node_capacity_per_s == pytest.approx(40)
    assert a.predicted_step_s == pytest.approx(0.050)       # max(0.05, 2 / 80)
    assert a.change_usd_per_hour == pytest.approx(-2 * 1.836)
    assert a.change_usd_per_epoch == pytest.approx(-3.672 * 1000 * 0.050 / 3600)


def test_the_ranks_own_receiving_work_is_not_taken_off_by_more_nodes():
    f = LiveFigures(0.040, 0.030, 1, (ServerFigures("d1:6000", 25.0, 1.0),), fetch_cpu_s=0.002)
    a = advise(f, PRICES)
    # compute 0.040 - 0.030 + 0.002 = 0.012; needed 1.1 / 0.012 = 91.7; (91.7 - 25) / 25 = 2.67 -> 3
    assert a.compute_s == pytest.approx(0.012) and a.change == 3 and a.predicted_step_s == pytest.approx(0.012)


def test_the_step_timer_measures_the_cpu_time_spent_receiving():
    def batches(busy):
        while True:
            if busy:  # 20 ms of this thread's CPU however busy the machine is
                end = time.thread_time() + 0.02
                while time.thread_time() < end:
                    pass
            else:
                time.sleep(0.02)
            yield 0

    seen = []
    for busy in (True, False):
        stats = StepStats(warmup=0, log_every=100)
        stats.record = lambda wait, step, samples, cpu: seen.append((wait, cpu)) or 0.0
        timer = StepTimer(stats)
        timer.fetch(batches(busy))
        timer.done(1)
    (busy_wait, busy_cpu), (idle_wait, idle_cpu) = seen
    assert busy_wait >= 0.02 and busy_cpu >= 0.02          # receiving work: CPU time
    assert idle_wait >= 0.02 and idle_cpu < busy_cpu / 4   # waiting for a server: next to none


def test_one_node_is_always_kept_and_a_fitting_group_is_left_alone():
    # compute 19.5 ms: needed 1.1 / 0.0195 = 56.4; 50 batches/s at 80 % busy: 62.5 possible
    a = advise(figures(0.020, 0.0005, 1, [ServerFigures("d1:6000", 50.0, 0.8)]), PRICES)
    assert a.change == 0 and a.predicted_step_s == pytest.approx(0.0195)  # compute; 1 / 62.5 = 0.016 below it
    tight = advise(figures(0.020, 0.0005, 1, [ServerFigures("d1:6000", 50.0, 0.9)]), PRICES)
    assert tight.change == 1   # 55.6 possible: less than the demand plus its headroom
    idle = advise(figures(0.050, 0.0, 1, [ServerFigures("d1:6000", 20.0, 0.01)]), PRICES)
    assert idle.change == 0  # one node, far more than needed: none can go


def test_a_job_that_does_not_wait_on_data_is_told_to_add_no_node_and_why():
    # busy share unknown: capacity as delivered, 50 batches/s = what the rank takes, under 55 with headroom
    full = [ServerFigures("d1:6000", 50.0, None)]
    still = advise(figures(0.020, 0.0, 1, full), PRICES)
    assert still.change == 0 and still.predicted_step_s == pytest.approx(0.020)
    line = advice_line(100, still.to_dict())
    assert "data node change +0" in line and "waits on data 0% of it" in line
    assert "no node to add while the step waits 0.0% on data (under 1%)" in line
    assert "the ranks take 50.0, 10% headroom would need 55.0" in line
    waiting = advise(figures(0.020, 0.002, 1, full), PRICES)  # 10 % of the step waits: the headroom rule adds one
    assert waiting.change == 1 and waiting.note == ""


@settings(max_examples=300, deadline=None)
@given(step=st.floats(1e-3, 10.0), wait_share=st.floats(0.0, 1.0), ranks=st.integers(1, 64),
       servers=st.lists(st.tuples(st.floats(0.0, 1e4), st.one_of(st.none(), st.floats(0.0, 1.0)), st.booleans()),
                        min_size=1, max_size=8))
def test_no_node_is_added_while_the_step_waits_under_the_threshold(step, wait_share, ranks, servers):
    f = LiveFigures(step, step * wait_share, ranks,
                    tuple(ServerFigures(f"d{i}:6000", rate, busy, new=new) for i, (rate, busy, new) in enumerate(servers)))
    a = advise(f)
    if a.data_wait_fraction < MIN_OUT_WAIT:
        assert a.change is None or a.change <= 0
        line = advice_line(1, a.to_dict())
        assert "data node change +" not in line or "data node change +0" in line
    if a.change is not None and a.change > 0:
        assert a.data_wait_fraction >= MIN_OUT_WAIT


def test_a_dnn_hosts_own_server_adds_capacity_but_is_not_a_data_node():
    servers = [ServerFigures("dnn:6000", 20.0, 1.0, data_node=False), ServerFigures("d1:6000", 20.0, 1.0)]
    a = advise(figures(0.050, 0.040, 1, servers), PRICES)
    # needed 110, capacity 40, one node 20: ceil(70 / 20) = 4 -> 120 batches/s, step max(0.01, 1 / 120)
    assert a.change == 4 and a.data_nodes == 1 and a.predicted_step_s == pytest.approx(0.010)


def test_nodes_not_measured_yet_count_like_the_measured_ones():
    old = ServerFigures("d1:6000", 25.0, 1.0)
    joined = [ServerFigures(f"n{i}:6000", 1.0, None, new=True) for i in range(3)]   # joined during the window
    a = advise(figures(0.040, 0.030, 1, [old] + joined), PRICES)
    # unit 25 (the measured node); capacity 25 + 3 x 25 = 100 < 110 -> one more; not +81 from 1 batch/s each
    assert a.node_capacity_per_s == pytest.approx(25.0) and a.capacity_per_s == pytest.approx(100.0)
    assert a.change == 1 and a.data_nodes == 4
    young = [ServerFigures(f"y{i}:6000", 16.0, None) for i in range(4)]   # up < 60 s: busy share not trusted
    fed = advise(figures(0.0125, 0.0015, 1, [ServerFigures("d1:6000", 16.0, 0.64)] + young), PRICES)
    # unit 16 / 0.64 = 25 for all five: 125 against 1.1 / 0.011 = 100 -> one could go (as delivered: 80 -> +2)
    assert fed.capacity_per_s == pytest.approx(125.0) and fed.change == -1
    alone = advise(figures(0.0125, 0.0015, 1, young), PRICES)  # nothing measured: as delivered
    assert alone.capacity_per_s == pytest.approx(64.0) and alone.change == 3


def test_no_delivery_no_advice_and_no_price_no_cost():
    a = advise(figures(0.050, 0.040, 1, [ServerFigures("d1:6000", 0.0, 0.0)]), PRICES)
    assert a.change is None and "no data node delivered" in a.note
    b = advise(LiveFigures(0.040, 0.030, 1, (ServerFigures("d1:6000", 25.0, 1.0),), None, "ml.local"), {})
    assert b.change == 4 and b.change_usd_per_hour is None and b.change_usd_per_epoch is None
    with pytest.raises(ValueError, match="step_s=0.0 must be a positive number"):
        advise(figures(0.0, 0.0, 1, []))


def test_the_live_model_is_the_planners():
    from launcher import capacity as model

    for compute, ranks, rate in [(0.01, 1, 25.0), (0.05, 8, 100.0), (0.2, 4, 12.5)]:
        planner = predict_step(preprocess_s=1.0, gpu_step_s=compute, cores=rate, consumers=ranks)
        live = figures(compute, 0.0, ranks, [ServerFigures("d1:6000", rate, 1.0)])
        assert model.predict(layout_of(live, compute, [rate])).step_s == pytest.approx(planner.step_s)


def test_steps_per_epoch_from_the_data_set():
    assert steps_per_epoch(1000, 8, True, 2) == 62       # 125 batches, 62 each
    assert steps_per_epoch(1001, 8, False, 1) == 126
    assert steps_per_epoch(0, 8, True, 1) is None


def test_window_figures_from_two_snapshots():
    # up 100 s: 100 sent and built in 10 s, busy share 0.5 -> 0.5 (5 of the 10 s busy)
    f = window_figures("a", Snapshot(100.0, 1000, 0.5, 1000), Snapshot(110.0, 1100, 0.5, 1100), True)
    assert f.batches_per_s == pytest.approx(10.0) and f.busy_fraction == pytest.approx(0.5)
    assert f.built_per_s == pytest.approx(10.0) and server_capacity(f) == pytest.approx(20.0)
    rising = window_figures("a", Snapshot(100.0, 1000, 0.5, 1000), Snapshot(110.0, 1200, 0.55, 1200), True)
    assert rising.busy_fraction == pytest.approx(1.0)   # (60.5 - 50) / 10, clipped
    young = window_figures("y", Snapshot(20.0, 100, 0.5, 100), Snapshot(30.0, 300, 0.75, 300), True)
    assert young.busy_fraction is None and server_capacity(young) == pytest.approx(20.0)  # as delivered
    new = window_figures("b", None, Snapshot(4.0, 40, 0.5), True)   # joined after the last snapshot
    assert new.batches_per_s == pytest.approx(10.0) and new.busy_fraction is None
    restarted = window_figures("c", Snapshot(500.0, 900, 0.5), Snapshot(2.0, 10, 0.9), True)
    assert restarted.batches_per_s == pytest.approx(5.0)
    # the end of training: consumers live on batches built earlier; built over busy stays the rate
    drain = ServerFigures("d", batches_per_s=20.0, busy_fraction=0.1, built_per_s=2.5)
    assert server_capacity(drain) == pytest.approx(25.0)   # not 20 / 0.1 = 200


class FakeServer:
    """GetStats/Hello of a server that builds ``rate`` batches per second of a fake clock."""

    def __init__(self, clock, rate, busy, server_id):
        self.clock, self.rate, self.busy, self.server_id = clock, rate, busy, server_id
        self.fail = False

    def stats(self, timeout):
        if self.fail:
            raise ConnectionError("down")
        t = self.clock[0]
        return type("S", (), {"uptime_s": t, "batches_sent": int(self.rate * t), "batches_built": int(self.rate * t),
                              "worker_busy_fraction": self.busy})

    def hello(self, timeout):
        info = type("D", (), {"num_samples": 8000, "batch_size": 8, "drop_last": True, "fingerprint": "fp"})
        return type("H", (), {"server_id": self.server_id, "dataset": info})

    def close(self):
        pass


def test_the_advisor_advises_every_n_steps_and_at_the_end(caplog):
    clock = [100.0]
    servers = {"d1:6000": FakeServer(clock, 25.0, 1.0, "s1")}
    advisor = LiveAdvisor(lambda: [("d1:6000", True)], "tok", ranks=1, every=10, warmup=2,
                          data_instance="ml.c5.9xlarge", dnn_instance="ml.p3.2xlarge", prices=PRICES,
                          client=lambda address, token, who: servers[address])
    stats = StepStats(warmup=2, log_every=1000, advisor=advisor)
    caplog.set_level(logging.INFO, logger="launcher.advice.advisor")
    for _ in range(23):
        clock[0] += 0.040
        stats.record(0.030, 0.040, 8)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("advice at step")]
    assert [line.split(":")[0] for line in lines] == ["advice at step 10", "advice at step 20"]
    assert "data node change +4" in lines[0] and "predicted step 0.0100 s" in lines[0]
    assert advisor.last["steps_per_epoch"] == 1000 and advisor.last["servers"][0]["batches_per_s"] == pytest.approx(25)
    summary = stats.summary()  # the last window (3 steps) is short: joined to the one before
    assert summary["advice"]["final"] and summary["advice"]["window_steps"] == 13
    assert summary["advice"]["change"] == 4
    assert [h["step"] for h in summary["advice"]["history"]] == [10, 20, 23]
    metrics = job_metrics([dict(summary, rank=0, host="algo-1")], {"mode": "heterogeneous"})
    assert metrics["advice"]["change"] == 4 and "advice" not in metrics["nodes"][0]["ranks"][0]


def test_a_server_that_does_not_answer_is_left_out_and_training_goes_on(caplog):
    clock = [100.0]
    servers = {"d1:6000": FakeServer(clock, 25.0, 1.0, "s1"), "d2:6000": FakeServer(clock, 25.0, 1.0, "s2")}
    advisor = LiveAdvisor(lambda: [("d1:6000", True), ("d2:6000", True)], "tok", ranks=1, every=5,
                          client=lambda address, token, who: servers[address])
    servers["d2:6000"].fail = True
    advisor.on_step(1, 0.0, 0.04)                         # no warm-up: the first step's snapshot
    for step in range(2, 6):
        clock[0] += 0.04
        advisor.on_step(step, 0.03, 0.04)
    assert "no stats from data server d2:6000" in caplog.text
    assert advisor.last["data_nodes"] == 1 and [s["address"] for s in advisor.last["servers"]] == ["d1:6000"]


def test_servers_that_joined_through_the_registry_count_once_and_strangers_not_at_all(tmp_path, caplog):
    from data_service.membership.registry import register

    clock = [100.0]
    servers = {a: FakeServer(clock, 25.0, 1.0, sid) for a, sid in
               [("d1:6000", "s1"), ("10.0.0.1:6000", "s1"), ("d2:6000", "s2"), ("d3:6000", "s3"), ("d4:6000", "s4")]}
    registry = str(tmp_path / "registry")
    register(registry, "tok", "s1", "10.0.0.1:6000", "fp")     # the job's own node, under another address
    register(registry, "tok", "s2", "d2:6000", "fp")           # a node that joined
    register(registry, "other-token", "s3", "d3:6000", "fp")   # not of this job
    register(registry, "tok", "s4", "d4:6000", "another-pipeline")
    advisor = LiveAdvisor(lambda: [("d1:6000", True)], "tok", ranks=1, every=5, registry=registry,
                          client=lambda address, token, who: servers[address])
    for step in range(1, 6):
        clock[0] += 0.04
        advisor.on_step(step, 0.03, 0.04)
    assert advisor.last["data_nodes"] == 2
    assert sorted(s["address"] for s in advisor.last["servers"]) == ["d1:6000", "d2:6000"]
    shutil.rmtree(registry)   # unreadable: the servers already known still count, and the log says so
    for step in range(6, 11):
        clock[0] += 0.04
        advisor.on_step(step, 0.03, 0.04)
    assert f"registry {registry} not read" in caplog.text and advisor.last["data_nodes"] == 2


def lines_points(line):
    return {d["Name"]: float(m.group(1)) for d in METRIC_DEFINITIONS if (m := re.search(d["Regex"], line))}


def test_the_advice_lines_feed_only_the_advice_metrics():
    a = advise(figures(0.040, 0.030, 1, [ServerFigures("d1:6000", 25.0, 1.0)]), PRICES).to_dict()
    line = advice_line(200, a)
    assert lines_points(line) == pytest.approx({
        "advice:data_node_change": 4, "advice:predicted_step_s": 0.01,
        "advice:change_usd_per_hour": 7.344, "advice:change_usd_per_epoch": 0.0204}, abs=1e-4)
    drop = advise(figures(0.050, 0.0, 2, [ServerFigures(f"d{i}", 10.0, 0.25) for i in range(4)]), PRICES).to_dict()
    final = advice_line(900, drop, final=True)
    assert final.startswith("advice at step 900 (end of training): data node change -2")
    assert lines_points(final)["advice:data_node_change"] == -2
    assert lines_points(final)["advice:change_usd_per_hour"] == pytest.approx(-3.672)
    unpriced = advice_line(5, advise(LiveFigures(0.04, 0.03, 1, (ServerFigures("d", 25.0, 1.0),)), {}).to_dict())
    assert set(lines_points(unpriced)) == {"advice:data_node_change", "advice:predicted_step_s"}
    none = advice_line(5, advise(figures(0.04, 0.03, 1, [ServerFigures("d", 0.0, None)])).to_dict())
    assert lines_points(none) == {}


def test_hetero_stats_local_reads_the_newest_advice(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    line = advice_line(40, advise(figures(0.040, 0.030, 1, [ServerFigures("d1:6000", 25.0, 1.0)]), PRICES).to_dict())
    (logs / "algo-1.log").write_text(
        "2026-11-25 10:00:01,000 trainer@algo-1 rank 0 INFO launcher.train.step_stats: step 40: avg step time 0.0400 s over "
        f"the last 40 steps, data wait 75%, 200.0 samples/s\n2026-11-25 10:00:01,001 trainer@algo-1 rank 0 INFO "
        f"launcher.advice.advisor: {line}\n")
    (logs / "algo-2.log").write_text("2026-11-25 10:00:02,000 data@algo-2 INFO launcher.serve.data_node: serving\n")
    assert main(["stats", "--local", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert line in out and "data wait 75%" in out
    assert json.loads(out[out.index("{"):]) == pytest.approx({
        "advice:data_node_change": 4, "advice:predicted_step_s": 0.01, "advice:change_usd_per_hour": 7.344,
        "advice:change_usd_per_epoch": 0.0204}, abs=1e-4)
    (logs / "algo-1.log").write_text("no advice yet\n")
    assert main(["stats", "--local", str(tmp_path)]) == 1
    assert "no advice in" in capsys.readouterr().err
    assert main(["stats", "--local", str(tmp_path / "nowhere")]) == 2


@pytest.mark.slow  # a whole process tree: the slow tier
def test_a_starved_local_job_logs_the_advice_and_writes_it_to_metrics_json(tmp_path, capsys):
    from hetero.local import LocalJob, run_local

    from _launcher_helpers import SYNTHETIC_HPS, synth_data

    # one data worker builds a batch of 8 in ~16 ms of CPU; the emulated step is 5 ms: the trainer waits
    hps = {**SYNTHETIC_HPS, "pipeline.size": 800, "pipeline.work_ms": 2, "emulate_step_s": 0.005,
           "warmup_steps": 5, "log_every": 40, "advice_every": 40, "advice_prices": {"ml.local": 0.5}}
    job = LocalJob(data=synth_data(tmp_path / "data", 16, 0), output=tmp_path / "out", hyperparameters=hps,
                   timeout_s=120, echo=False)
    done: list = []
    runner = threading.Thread(target=lambda: done.append(run_local(job)))
    runner.start()
    seen = []   # what `hetero stats --local` shows while the job runs
    while runner.is_alive():
        if (tmp_path / "out" / "logs").is_dir() and (found := latest_advice(tmp_path / "out" / "logs")):
            seen.append(found["advice"])
        time.sleep(0.05)
    runner.join()
    result = done[0]
    logs = {p.stem: p.read_text() for p in (result.output / "logs").glob("*.log")}
    assert result.ok, "\n".join(t[-3000:] for t in logs.values())
    m = result.metrics
    trainer = logs[m["dnn_hosts"][0]]
    lines = [line for line in trainer.splitlines() if "advice at step" in line]
    assert len(lines) == 3 and "rank 0" in lines[0], lines   # steps 40, 80, then the end (100)
    assert "advice at step 100 (end of training)" in lines[-1]
    a = m["advice"]
    assert a["change"] >= 1 and a["data_nodes"] == 1 and a["data_instance"] == "ml.local"
    assert a["predicted_step_s"] < a["step_s"] and a["predicted_step_s"] >= a["compute_s"] >= 0.005
    assert a["change_usd_per_hour"] == pytest.approx(0.5 * a["change"])
    assert lines_points(lines[-1])["advice:data_node_change"] == a["change"]
    assert lines_points(lines[-1])["advice:predicted_step_s"] == pytest.approx(a["predicted_step_s"], abs=6e-5)
    assert seen and "advice at step 40:" in seen[0], seen[:1]   # shown before the job ended
    assert main(["stats", "--local", str(result.output)]) == 0
    out = capsys.readouterr().out
    assert lines[-1] in out and "step 80: avg step time" in out
    assert json.loads(out[out.index("{"):])["advice:data_node_change"] == a["change"]


@pytest.mark.slow  # two local jobs, about a minute
@pytest.mark.serial
def test_the_advised_nodes_give_the_predicted_step_within_20_percent(tmp_path):
    from hetero.local import LocalJob, run_local

    from _launcher_helpers import synth_data

    # batches take 40 ms of sleep on one worker (no CPU: nodes add capacity even on one core);
    # the emulated step is 10 ms, so one data node starves the trainer
    hps = {"pipeline": "tests._sleep_pipeline:build", "pipeline.size": 1600, "pipeline.sample_ms": 5,
           "data_workers": 1, "loader_workers": 0, "emulate_step_s": 0.010, "warmup_steps": 10, "advice_every": 50}

    def run(nodes, name):
        result = run_local(LocalJob(data=synth_data(tmp_path / "data", 16, 0), output=tmp_path / name,
                                    data_nodes=nodes, hyperparameters=hps, timeout_s=300, echo=False))
        assert result.ok, result.failure
        return result.metrics

    before = run(1, "one")
    advice = before["advice"]
    assert advice["change"] >= 2 and before["data_wait_fraction"] > 0.5
    after = run(1 + advice["change"], "more")
    assert after["avg_step_time_s"] == pytest.approx(advice["predicted_step_s"], rel=0.2)
    assert after["data_wait_fraction"] < 0.25 and after["advice"]["change"] in (-1, 0, 1)
