"""The autoscaler end to end without a job: advice in, decisions logged, hooks run, servers drained,
state kept beside the registry; settings checked at start. Real servers, real registry folders."""
from __future__ import annotations

import json
import logging
import sys
import time

import pytest

from conftest import TOKEN
from data_service.membership import joining, registry
from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions
from launcher.autoscale import Autoscaler, CommandActuator, Settings
from launcher.autoscale.actuators import PartialScaleOut
from launcher.autoscale.state import StateStore
from launcher.config import LaunchConfig
from launcher.metric_lines import METRIC_DEFINITIONS

PIPELINE = "examples.synthetic:build_pipeline"


def advice(step, nodes, change, wait, price=0.5):
    return {"step": step, "data_nodes": nodes, "change": change, "data_wait_fraction": wait,
            "node_capacity_per_s": 20.0, "node_usd_per_hour": price}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def hook_settings(tmp_path, **more) -> Settings:
    out = tmp_path / "hook.log"
    keys = "('HETERO_SCALE_ACTION','HETERO_SCALE_COUNT','HETERO_SCALE_TARGET','HETERO_REGISTRY')"
    cmd = f"{sys.executable} -c \"import os,sys; open(sys.argv[1],'a').write(' '.join(os.environ[k] for k in " \
          f"{keys})+' '+sys.argv[2]+'\\n')\""
    return Settings.from_options({"mode": "act", "actuator": "command", "min": 1, "max": 5, "cooldown_s": 30,
                                  "scale_out_cmd": f"{cmd} {out} {{count}}", "scale_in_cmd": f"{cmd} {out} {{servers}}",
                                  **more}, registry=str(tmp_path / "reg"))


def test_decisions_run_the_hook_are_logged_and_survive_a_restart(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    reg = str(tmp_path / "reg")
    settings, clock = hook_settings(tmp_path), Clock()
    scaler = Autoscaler(settings, CommandActuator(settings.scale_out_cmd, settings.scale_in_cmd), reg, TOKEN,
                        clock=clock)
    d = scaler.on_advice(advice(100, 1, 3, 0.6))
    assert (d["action"], d["count"], d["target"], d["usd_per_hour"]) == ("out", 3, 4, 2.0)
    scaler.close()
    assert (tmp_path / "hook.log").read_text().split() == ["out", "3", "4", reg, "3"]
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("autoscale at step 100"))
    import re
    got = {m["Name"]: float(re.search(m["Regex"], line).group(1)) for m in METRIC_DEFINITIONS
           if m["Name"].startswith("autoscale:")}
    assert got == {"autoscale:target_nodes": 4, "autoscale:node_change": 3, "autoscale:usd_per_hour": 2.0}
    saved = json.loads((tmp_path / "reg" / "autoscale" / "state.json").read_text())
    assert saved["policy"]["promised"] == 4 and saved["history"][-1]["action"] == "out"

    # rank 0 restarts 10 s later: the saved state keeps the promise and the cooldown
    clock.t += 10
    again = Autoscaler(settings, CommandActuator(settings.scale_out_cmd), reg, TOKEN, clock=clock)
    assert again.resumed and again.state.promised == 4
    d = again.on_advice(advice(200, 2, 2, 0.5))  # two joined so far, the advice still says 4
    assert d["action"] == "hold" and "waiting for 2" in d["reason"]
    clock.t += 700  # the promise timed out (join_timeout_s) and the cooldown passed
    d = again.on_advice(advice(300, 2, 1, 0.4))
    assert (d["action"], d["count"]) == ("out", 1)
    again.close()
    assert again.summary()["actions"] == 2 and len(again.summary()["decisions"]) == 3


@pytest.fixture
def joined_servers(tmp_path):
    reg = str(tmp_path / "reg")
    started = []

    def make(n):
        for _ in range(n):
            s = DataServer(PipelineSpec(PIPELINE, {"size": 64, "batch_size": 4}), TOKEN,
                           ServerOptions(num_workers=1, probe=False)).start()
            joining.join(s, reg, s.address, leave_delay_s=0.1)
            started.append(s)
            time.sleep(0.01)  # distinct started_at: the newest is drained first
        return started

    yield reg, make
    for s in started:
        s.leave_delay_s = 0.0
        s.shutdown(grace_s=1.0, block=False)
    for s in started:
        s.wait(10.0)


@pytest.mark.slow  # two real servers start and drain: about 5 s on 2 busy cores
def test_scale_in_drains_the_newest_joined_servers_never_the_jobs_own(tmp_path, joined_servers):
    reg, make = joined_servers
    fp = PipelineSpec(PIPELINE, {"size": 64, "batch_size": 4}).fingerprint()
    own = registry.register(reg, TOKEN, "own-node", "127.0.0.1:9", fp)  # the job's own data node
    older, newest = make(2)
    settings, clock = hook_settings(tmp_path, in_after=1), Clock()
    scaler = Autoscaler(settings, CommandActuator(settings.scale_out_cmd, settings.scale_in_cmd), reg, TOKEN,
                        fixed=[own.address], clock=clock)
    d = scaler.on_advice(advice(100, 3, -2, 0.0))
    assert (d["action"], d["count"], d["target"]) == ("in", 2, 1)
    scaler.close(timeout=30)
    assert newest.wait(10) and older.wait(10)
    assert [e.server_id for e in registry.read_entries(reg)[0]] == [own.server_id]
    assert scaler.drained == [newest.server_id, older.server_id]
    released = (tmp_path / "hook.log").read_text().split()
    assert released[:2] == ["in", "2"] and released[-1] == f"{newest.address},{older.address}"
    # the next advice below min drains nothing: the job's own node stays
    d = scaler.on_advice(advice(200, 1, 0, 0.0))
    assert d["action"] == "hold"


@pytest.mark.parametrize("options, match", [
    ({"min": 4, "max": 2}, "autoscale.max=2 must be >= autoscale.min=4"),
    ({"mode": "act", "actuator": "ec2"}, "autoscale.actuator='ec2' is unknown"),
    ({"mode": "act"}, "needs autoscale.actuator"),
    ({"mode": "act", "actuator": "command"}, "needs autoscale.scale_out_cmd"),
    ({"mode": "sometimes"}, "autoscale.mode='sometimes'"),
    ({"mx": 3}, "unknown autoscale option 'mx'"),
    ({"max": "many"}, "autoscale.max='many' must be a int"),
    ({"usd_per_hour": -2}, "autoscale.usd_per_hour=-2"),
    ({"ttl_s": "inf"}, r"autoscale.ttl_s=inf must be a finite number in \(0, 3600\]"),
    ({"drain_grace_s": "nan"}, r"autoscale.drain_grace_s=nan must be a finite number in \(0, 3600\]"),
    ({"hook_timeout_s": 0}, r"autoscale.hook_timeout_s=0.0 must be a finite number in \(0, 86400\]"),
    ({"workers": 1000}, "autoscale.workers=1000 must be 1..256"),
    ({"join_timeout_s": "inf"}, "autoscale.join_timeout_s=inf must be a finite number of seconds"),
])
def test_bad_settings_are_clear_errors_at_start(options, match):
    hps = {"registry": "/tmp/reg", **{f"autoscale.{k}": v for k, v in options.items()}}
    with pytest.raises(ConfigError, match=match):
        LaunchConfig.from_hyperparameters(hps)


def test_act_needs_a_registry_and_a_cap_below_the_group_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="needs the job's registry"):
        LaunchConfig.from_hyperparameters({"autoscale.mode": "act", "autoscale.actuator": "local"})
    settings = Settings.from_options({"mode": "act", "actuator": "local", "usd_per_hour": 1.0},
                                     registry=str(tmp_path))
    scaler = Autoscaler(settings, None, str(tmp_path), TOKEN)
    with pytest.raises(ConfigError, match=r"pays for 2 data node\(s\) at 0.5 \$/h, the job starts with 3"):
        scaler.check_start(3, 0.5)
    scaler.check_start(2, 0.5)
    with pytest.raises(ConfigError, match=r"usd_per_hour=1 needs the \$/h price of ml.c5.9xlarge .*advice_prices"):
        scaler.check_start(2, None, "ml.c5.9xlarge")
    uncapped = Autoscaler(Settings.from_options({"mode": "act", "actuator": "local"}, registry=str(tmp_path)), None,
                          str(tmp_path), TOKEN)
    uncapped.check_start(2, None, "ml.c5.9xlarge")  # no cap: no price needed


def test_advise_mode_logs_decisions_without_acting(tmp_path):
    settings = Settings.from_options({"mode": "advise"}, registry=str(tmp_path))
    scaler = Autoscaler(settings, CommandActuator("exit 1"), str(tmp_path), TOKEN, clock=Clock())
    d = scaler.on_advice(advice(100, 1, 2, 0.5))
    scaler.close()
    assert d["action"] == "out" and d["mode"] == "advise" and scaler.actuator.runs == []


def test_a_state_file_that_is_not_json_starts_afresh(tmp_path, caplog):
    (tmp_path / "autoscale").mkdir()
    (tmp_path / "autoscale" / "state.json").write_text("{nope")
    assert StateStore(str(tmp_path)).load() == {}
    assert "not JSON" in caplog.text


def test_hetero_stats_local_shows_the_latest_decision_with_its_figures(tmp_path, capsys):
    from hetero.cli import main
    from launcher.metric_lines import autoscale_line

    logs = tmp_path / "logs"
    logs.mkdir()
    settings = Settings.from_options({"mode": "act", "actuator": "local"}, registry=str(tmp_path))
    d = Autoscaler(settings, None, str(tmp_path), TOKEN, clock=Clock()).on_advice(advice(300, 1, 3, 0.6))
    (logs / "algo-1.log").write_text(
        "2026-11-26 10:00:01,000 trainer@algo-1 rank 0 INFO launcher.advice.advisor: advice at step 300: data node change "
        "+3 (now 1 x ml.local, 10.0 batches per s delivered, 10.0 per node possible): predicted step 0.0100 s\n"
        f"2026-11-26 10:00:01,001 trainer@algo-1 rank 0 INFO launcher.autoscale.controller: {autoscale_line(d)}\n")
    assert main(["stats", "--local", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "node change +3 (add; data nodes 1 -> 4" in out
    figures = json.loads(out[out.index("{"):])
    assert (figures["autoscale:target_nodes"], figures["autoscale:node_change"], figures["autoscale:usd_per_hour"]) \
        == (4, 3, 2.0)


@pytest.mark.parametrize("argv, message", [
    (["min=3", "max=2"], "autoscale.max=2 must be >= autoscale.min=3"),
    (["actuator=ec2"], "autoscale.actuator='ec2' is unknown"),
    (["max"], "--autoscale 'max' must be KEY=VALUE"),
    (["usd_per_hour=0.8", "--data-nodes", "2"], r"pays for 1 data node(s) at 0.5 $/h, the job starts with 2"),
    (["usd_per_hour=3", "--hp", "advice_prices={}"], "needs the $/h price of the data instance type"),
])
def test_hetero_local_autoscale_refuses_bad_settings_before_any_node_starts(tmp_path, capsys, argv, message):
    from hetero.cli import main

    assert main(["local", "--output", str(tmp_path / "out"), "--quiet", "--hp", 'advice_prices={"ml.local": 0.5}',
                 "--autoscale", *argv]) == 2
    assert message in "".join(capsys.readouterr())
    assert not (tmp_path / "out" / "logs").exists()


def test_an_advice_it_cannot_read_is_logged_and_training_goes_on(tmp_path, caplog):
    settings = Settings.from_options({"mode": "act", "actuator": "local"}, registry=str(tmp_path))
    scaler = Autoscaler(settings, None, str(tmp_path), TOKEN, clock=Clock())
    assert scaler.on_advice({"step": 7, "data_nodes": "many", "change": 1}) is None
    assert "no decision on the advice at step 7" in caplog.text


def test_step_stats_hands_each_periodic_advice_to_the_autoscaler_once(tmp_path):
    from launcher.train.step_stats import StepStats

    class Advisor:  # LiveAdvisor's two calls: a periodic advice every 2 steps, the final one at the end
        last = None

        def on_step(self, steps, wait_s, step_s, fetch_cpu_s=0.0):
            if steps % 2 == 0:
                self.last = dict(advice(steps, 1, 2, 0.5))

        def final(self, steps):
            return {"change": 0, "step": steps, "final": True}

    settings = Settings.from_options({"mode": "act", "actuator": "local", "cooldown_s": 0}, registry=str(tmp_path))
    scaler = Autoscaler(settings, None, str(tmp_path), TOKEN, clock=Clock())
    stats = StepStats(0, 100, advisor=Advisor(), autoscaler=scaler)
    for _ in range(5):
        stats.record(0.01, 0.02, 8)
    summary = stats.summary()
    decisions = summary["advice"]["autoscale"]["decisions"]
    assert [d["step"] for d in decisions] == [2, 4]  # one decision per advice, none for the final one
    assert decisions[0]["action"] == "out" and decisions[1]["action"] == "hold"  # promised, not yet joined
    assert summary["advice"]["final"] is True and summary["advice"]["autoscale"]["settings"]["mode"] == "act"


def test_an_advice_line_reads_back_as_the_figures_the_policy_takes():
    from launcher.advice.model import LiveFigures, ServerFigures, advise
    from launcher.metric_lines import advice_line, parse_advice_line

    a = advise(LiveFigures(0.04, 0.03, 1, (ServerFigures("d1:6000", 25.0, 1.0),), 100, "ml.c5.9xlarge"),
               {"ml.c5.9xlarge": 1.836}).to_dict()
    got = parse_advice_line("2026-11-26 10:00:00,000 trainer@algo-1 rank 0 INFO launcher.advice.advisor: "
                            + advice_line(300, a))
    assert (got["step"], got["change"], got["data_nodes"], got["final"]) == (300, a["change"], 1, False)
    assert got["node_usd_per_hour"] == pytest.approx(1.836) and got["data_wait_fraction"] == 0.75
    assert parse_advice_line(advice_line(9, a, final=True))["final"] is True
    assert parse_advice_line(advice_line(9, dict(a, change=None))) is None  # no change to advise


def test_a_registry_read_that_fails_while_draining_is_not_taken_for_the_servers_leaving(tmp_path, monkeypatch):
    import launcher.autoscale.controller as controller

    reg = str(tmp_path / "reg")
    entry = registry.register(reg, TOKEN, "drained-node", "127.0.0.1:9", "fp")
    settings = hook_settings(tmp_path, drain_grace_s=0.1)
    scaler = Autoscaler(settings, CommandActuator(settings.scale_out_cmd, settings.scale_in_cmd), reg, TOKEN)
    calls = []

    def flaky(uri, token, *args, **kwargs):
        calls.append(uri)
        if len(calls) == 1:
            raise registry.RegistryError("listing timed out")
        if len(calls) == 2:
            registry.unregister(reg, entry.server_id)
        return registry.verified_entries(uri, token, *args, **kwargs)

    monkeypatch.setattr(controller, "verified_entries", flaky)
    try:
        scaler._wait_left([entry])
    finally:
        scaler.close(timeout=5)
    assert len(calls) >= 2  # it read the registry again instead of ending its wait at the failure
    assert registry.read_entries(reg)[0] == []


class CountingActuator:
    """Records the controller's calls; ``fail_after`` makes a scale-out fail after that many nodes."""

    name = "counting"

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail_after, self.can_stop = fail_after, 99

    def scale_out(self, count, ctx):
        self.calls.append(("out", count))
        ids = [f"n{len(self.calls)}-{i}" for i in range(count)]
        if self.fail_after is not None:
            raise PartialScaleOut(ids[:self.fail_after], count, RuntimeError("ResourceLimitExceeded"))
        return ids

    def drain(self, count, ctx):
        self.calls.append(("in", count))
        return [f"d{len(self.calls)}-{i}" for i in range(min(count, self.can_stop))]

    def scale_in(self, drained, ctx):
        pass

    def close(self):
        pass


def test_a_drain_under_way_is_not_asked_again_while_the_drained_nodes_leave(tmp_path):
    settings = Settings.from_options({"mode": "act", "actuator": "command", "scale_out_cmd": "true", "max": 4,
                                      "cooldown_s": 0}, registry=str(tmp_path))
    clock, actuator = Clock(), CountingActuator()
    scaler = Autoscaler(settings, actuator, str(tmp_path), TOKEN, clock=clock, drain_by_actuator=True)
    for step, nodes in ((100, 6), (200, 6), (300, 5), (400, 4)):  # read at 0, 10, 20, 30 s
        scaler.on_advice(advice(step, nodes, 0, 0.0))
        scaler.wait(10.0)
        clock.t += 10
    restarted = Autoscaler(settings, actuator, str(tmp_path), TOKEN, clock=clock, drain_by_actuator=True)
    restarted.on_advice(advice(500, 4, 0, 0.0))
    scaler.close(), restarted.close()
    assert actuator.calls == [("in", 2)]
    assert [h["action"] for h in scaler.history] == ["in", "hold", "hold", "hold"]


def test_a_scale_out_that_fails_part_way_keeps_the_nodes_it_started(tmp_path):
    settings = Settings.from_options({"mode": "act", "actuator": "command", "scale_out_cmd": "true", "max": 8},
                                     registry=str(tmp_path))
    actuator = CountingActuator(fail_after=2)
    scaler = Autoscaler(settings, actuator, str(tmp_path), TOKEN, clock=Clock(), drain_by_actuator=True)
    scaler.on_advice(advice(100, 1, 4, 0.5))
    scaler.close(10.0)
    assert actuator.calls == [("out", 4)] and scaler.started == ["n1-0", "n1-1"]
    assert scaler.state.promised == 3  # 1 serving + the 2 started: the missing 2 are not waited for
    saved = StateStore(str(tmp_path)).load()
    assert saved["started"] == ["n1-0", "n1-1"] and saved["policy"]["promised"] == 3


def test_a_drain_that_stops_fewer_nodes_than_asked_counts_the_rest_as_serving(tmp_path):
    settings = Settings.from_options({"mode": "act", "actuator": "command", "scale_out_cmd": "true", "max": 4},
                                     registry=str(tmp_path))
    actuator = CountingActuator()
    actuator.can_stop = 1  # one of the two data-only jobs had ended already
    scaler = Autoscaler(settings, actuator, str(tmp_path), TOKEN, clock=Clock(), drain_by_actuator=True)
    scaler.on_advice(advice(100, 6, 0, 0.0))
    scaler.close(10.0)
    assert actuator.calls == [("in", 2)] and scaler.state.draining == 5
