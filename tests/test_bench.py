"""The step-time benchmark (hetero/bench): figures, costs, output, CPU accounting, runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from hetero.bench import report as bench_report
from hetero.bench import step_time
from hetero.bench.cpu_monitor import NodeCpuMonitor, parse_cpu_list
from hetero.bench.records import BenchConfig, RunResult
from hetero.bench.summary import add_costs, add_prediction, cores_had, summarize
from hetero.cli import main as hetero_main
from hetero.planning.cost import load_prices
from hetero.planning.profile import ProfileResult

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs (trainer + data)")


def _run(mode: str, rnd: int, step: float, wait: float = 0.5, ok: bool = True, foreign: float = 0.05) -> RunResult:
    metrics = {"avg_step_time_s": step, "data_wait_fraction": wait, "samples_per_s": 64 / step, "steps": 150,
               "warmup_steps_discarded": 10, "step_kind": "emulated"}
    cpu = [{"host": "algo-1", "role": "dnn_group", "cpus": [0], "busy_share": 0.9}]
    return RunResult(mode, rnd, ok, 30.0, metrics if ok else None, cpu, {0: 0.95}, [step], foreign)


def _summary(tmp_path, runs) -> dict:
    cfg = BenchConfig([0], [1], repeats=3, output=tmp_path, max_foreign=0.25, emulate_step_s=0.05)
    s = summarize(cfg, runs)
    add_costs(cfg, s, load_prices())
    add_prediction(cfg, s, [ProfileResult("p", {}, 1, 64, 0.16, 0.15, 0.2, 1)], runs)
    s["config"] = {**vars(cfg), "output": str(tmp_path)}
    s["profile"] = {"median_s": 0.16, "min_s": 0.15, "max_s": 0.2, "cpu": 1, "times_s": [0.2] + [0.16] * 8,
                    "warmup_batches": 1}
    return s


FAKE = [("homogeneous", 0, 0.16), ("heterogeneous", 0, 0.08), ("heterogeneous", 1, 0.10),
        ("homogeneous", 1, 0.18), ("homogeneous", 2, 0.17), ("heterogeneous", 2, 0.085)]


def test_summary_medians_spread_speedup_and_costs(tmp_path):
    s = _summary(tmp_path, [_run(*r) for r in FAKE] + [_run("heterogeneous", 3, 9.9, ok=False)])
    homo, het = s["modes"]["homogeneous"], s["modes"]["heterogeneous"]
    assert s["basis"] == "quiet rounds" and s["quiet_rounds"] == [0, 1, 2] and s["rounds"] == [0, 1, 2, 3]
    assert homo["step_time_s"] == {"median": 0.17, "min": 0.16, "max": 0.18, "n": 3}
    assert het["step_time_s"]["median"] == 0.085 and het["runs"] == 3
    assert s["modes_all_rounds"]["heterogeneous"]["failed_runs"] == 1
    assert s["speedup"] == pytest.approx(0.17 / 0.085)
    assert s["speedup_per_round"] == pytest.approx([2.0, 1.8, 0.17 / 0.085])
    table = load_prices()
    p3, c5 = table.hourly("ml.p3.2xlarge"), table.hourly("ml.c5.9xlarge")
    assert homo["cost"]["usd_per_step"] == pytest.approx(p3 * 0.17 / 3600)
    assert het["cost"]["usd_per_1000_steps"] == pytest.approx(1000 * (p3 + c5) * 0.085 / 3600)
    assert het["cost"]["usd_per_epoch"] == pytest.approx(937 * (p3 + c5) * 0.085 / 3600)   # 60000 // 64
    assert s["cost_ratio"] == pytest.approx(p3 * 0.17 / ((p3 + c5) * 0.085))
    pred = s["prediction"]                       # 160 ms/batch, 50 ms emulated step, 1 vs 2 cores
    assert pred["homogeneous"]["step_s"] == pytest.approx(0.16) and pred["heterogeneous"]["step_s"] == pytest.approx(0.08)
    assert pred["heterogeneous"]["measured_step_s"] == 0.085


def test_the_prediction_counts_the_cores_each_node_had_and_the_trainers_work(tmp_path):
    cfg = BenchConfig([0], [1], repeats=1, output=tmp_path, emulate_step_s=0.02)
    prof = ProfileResult("p", {}, 1, 64, 0.30, 0.25, 0.35, 1, finish_s=0.06, cpu_s=0.10, finish_cpu_s=0.02)
    # with the trainer's core busy meanwhile a batch costs more CPU on the data core, the finish stage too
    beside = [ProfileResult("p", {}, 1, 64, 0.30, 0.25, 0.35, 1, finish_s=0.06, cpu_s=c, finish_cpu_s=f, busy_cpus=[0])
              for c, f in ((0.12, 0.024), (0.13, 0.026))]

    def run(mode, busy, cpu):  # each node used cpu_s of its 100 s; the cores were ``busy`` (anyone's)
        nodes = [{"host": f"algo-{i}", "role": role, "cpus": [c], "wall_s": 100.0, "cpu_s": cpu[i], "busy_share": cpu[i] / 100}
                 for i, (role, c) in enumerate([("dnn_group", 0), ("data_group", 1)][:len(cpu)])]
        metrics = {"avg_step_time_s": 0.1, "data_wait_fraction": 0.8, "samples_per_s": 640, "steps": 100,
                   "warmup_steps_discarded": 20}
        return RunResult(mode, 0, True, 100.0, metrics, nodes, dict(enumerate(busy)), [0.1], 0.5)

    # others took 60 % of core 0 and 50 % of core 1 while the runs used the rest
    runs = [run("homogeneous", [1.0], [40.0]), run("heterogeneous", [1.0, 1.0], [40.0, 50.0])]
    s = summarize(cfg, runs)
    add_prediction(cfg, s, [prof], runs, beside=beside)
    homo, het = s["prediction"]["homogeneous"], s["prediction"]["heterogeneous"]
    assert homo["cores_had"] == pytest.approx(0.4) and het["trainer_cores_had"] == pytest.approx(0.4)
    assert het["data_cores_had"] == pytest.approx(0.5)
    # homogeneous, the other core idle: 100 ms a batch, 20 ms of finish stage on the trainer's core
    assert homo["step_s"] == pytest.approx(0.12 / 0.4)
    # heterogeneous, both cores busy (the mean of the profiles beside the trainer's busy core):
    # 125 ms a batch, 25 ms of finish stage for every batch, whoever built it
    assert het["build_cpu_s"] == pytest.approx(0.125) and het["trainer_s"] == pytest.approx(0.025)
    assert het["step_s"] == pytest.approx(0.15 / 0.9)          # (0.5 / 0.125 x 0.125 + 0.4) / 0.15 batches/s
    assert het["pinned_step_s"] == pytest.approx(0.36 / 2)     # whole cores, wall seconds
    no_local = BenchConfig([0], [1], repeats=1, output=tmp_path, emulate_step_s=0.02, local_server=False)
    s = summarize(no_local, runs)
    add_prediction(no_local, s, [prof], runs, beside=beside)
    assert s["prediction"]["heterogeneous"]["step_s"] == pytest.approx(0.125 / 0.5)   # the data core alone


def test_contended_rounds_are_left_out_of_the_headline_but_kept(tmp_path):
    runs = [_run(*r) for r in FAKE] + [_run("homogeneous", 3, 0.15, foreign=0.1),
                                       _run("heterogeneous", 3, 0.30, foreign=0.6)]
    s = _summary(tmp_path, runs)
    assert s["quiet_rounds"] == [0, 1, 2] and s["modes"]["heterogeneous"]["step_time_s"]["max"] == 0.10
    assert s["modes_all_rounds"]["heterogeneous"]["step_time_s"]["max"] == 0.30
    assert s["all_rounds_speedup_per_round"][-1] == pytest.approx(0.5)
    assert "3 of 4 round(s) quiet" in bench_report.markdown(s) and "All 4 rounds" in bench_report.markdown(s)
    noisy = _summary(tmp_path, [_run(m, r, t, foreign=0.5) for m, r, t in FAKE])
    assert noisy["basis"] == "all rounds" and noisy["speedup"] == pytest.approx(2.0)
    assert "No round was quiet" in bench_report.markdown(noisy)


def test_markdown_json_png(tmp_path):
    s = _summary(tmp_path, [_run(*r) for r in FAKE])
    text = bench_report.markdown(s)
    assert "EMULATED accelerator step (50 ms sleep" in text
    assert "| homogeneous | 1 x ml.p3.2xlarge (CPUs 0) | 0.1700 | 0.1600-0.1800 (3 runs) | 50% |" in text
    assert "+ 1 x ml.c5.9xlarge (CPUs 1)" in text and "first 10 discarded" in text
    assert "**Speed-up** (homogeneous / heterogeneous step time, medians): 2.00x" in text
    assert "0.0800 s predicted" in text and "0.0850 s measured" in text
    bench_report.write_json(tmp_path / "b.json", s)
    assert json.loads((tmp_path / "b.json").read_text())["speedup"] == pytest.approx(2.0)
    bench_report.write_png(tmp_path / "b.png", s)
    data = (tmp_path / "b.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_step_windows_skip_warmup(tmp_path):
    log = tmp_path / "algo-1.log"
    log.write_text("x step 15: avg step time 0.5000 s over the last 15 steps, data wait 90%\n"
                   "x step 30: avg step time 0.2000 s over the last 15 steps, data wait 80%\n"
                   "x step 45: avg step time 0.3000 s over the last 15 steps, data wait 80%\n")
    assert step_time.step_windows(log, warmup=10) == [0.2, 0.3]
    assert step_time.step_windows(log, warmup=15) == [0.2, 0.3]
    assert step_time.step_windows(log, warmup=16) == [0.3]
    assert step_time.step_windows(tmp_path / "missing.log", 0) == []


_BURN = "import time\nt=time.process_time()\nwhile time.process_time()-t<{s}: pass\n"


@pytest.mark.slow  # timing-sensitive sampling: flaky on a loaded 2-core VM
@pytest.mark.serial
def test_cpu_monitor_counts_busy_idle_and_reaped_children():
    env = {**os.environ, "SM_CURRENT_INSTANCE_GROUP": "g"}
    # "busy" burns 0.6 s of CPU in a grandchild that exits (reaped), then idles: its time must stay counted.
    # The monitor counts a node from its first sample of it, so "busy" burns only once both nodes were
    # seen (on a loaded machine that sample can come after most of the burn).
    busy_code = ("import subprocess, sys, time\nsys.stdin.readline()\n"
                 f"subprocess.run([sys.executable, '-c', {_BURN.format(s=0.6)!r}])\ntime.sleep(2.0)\n")
    with NodeCpuMonitor(interval_s=0.4) as mon:  # coarse: a lost reaped child shows
        procs = [subprocess.Popen([sys.executable, "-c", busy_code], env={**env, "SM_CURRENT_HOST": "busy"},
                                  stdin=subprocess.PIPE),
                 subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3.0)"],
                                  env={**env, "SM_CURRENT_HOST": "idle"})]
        deadline = time.monotonic() + 30
        while {p.pid for p in procs} - set(mon.nodes) and time.monotonic() < deadline:
            time.sleep(0.05)
        procs[0].stdin.write(b"go\n")
        procs[0].stdin.close()
        for p in procs:
            p.wait(30)
        time.sleep(0.2)
    nodes = {n["host"]: n for n in mon.summary()}
    assert set(nodes) == {"busy", "idle"} and nodes["busy"]["role"] == "g"
    assert nodes["busy"]["cpu_s"] >= 0.55, nodes            # the reaped grandchild's 0.6 s
    # "idle" is one interpreter start-up; "busy" is that, plus the grandchild's start-up and its 0.6 s burn
    assert nodes["idle"]["cpu_s"] < nodes["busy"]["cpu_s"] - 0.4 and \
        nodes["idle"]["busy_share"] < nodes["busy"]["busy_share"]
    assert set(mon.core_busy) == set(range(len(mon.core_busy))) and all(0 <= v <= 1 for v in mon.core_busy.values())


@pytest.mark.slow  # timing-sensitive sampling: flaky on a loaded 2-core VM
@pytest.mark.serial
def test_tree_cpu_time_keeps_reaped_children():
    import psutil

    from hetero.bench.cpu_monitor import _tree_cpu_s

    code = (f"import subprocess, sys, time\nsubprocess.run([sys.executable, '-c', {_BURN.format(s=0.5)!r}])\n"
            "print('reaped', flush=True)\ntime.sleep(5)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "reaped"
        assert _tree_cpu_s(psutil.Process(p.pid)) >= 0.5
    finally:
        p.kill()
        p.wait()


def test_parse_cpu_list():
    assert parse_cpu_list(f"{CPUS[0]}") == [CPUS[0]]
    with pytest.raises(ValueError, match="usable"):
        parse_cpu_list("4096")
    with pytest.raises(ValueError, match="must look like"):
        parse_cpu_list("a-b")


@pytest.mark.parametrize("argv, needle", [
    (["--data-instance", "ml.c9.huge"], "known types: ml.c5.18xlarge"),
    (["--dnn-instance", "p3"], "no price for instance type 'p3'"),
    (["--trainer-cpus", "0", "--data-cpus", "0"], "share CPUs [0]"),
    (["--warmup", "200", "--steps", "100"], "--warmup 200"),
    (["--synth-train", "100"], "--synth-train 100"),
])
def test_bad_input_exits_2_before_running(tmp_path, capsys, argv, needle):
    rc = hetero_main(["bench", "--output", str(tmp_path / "o"), "--trainer-cpus", str(CPUS[0]),
                      "--data-cpus", str(CPUS[-1])] + argv)
    assert rc == 2 and needle in capsys.readouterr().out
    assert not (tmp_path / "o" / "data").exists()


def test_with_no_step_given_the_step_is_a_third_of_the_batch_profiled_in_the_run():
    cfg = BenchConfig([0], [1])
    assert cfg.emulate_step_s is None  # the default: derived, not a constant tied to some machine's speed
    with pytest.raises(ValueError, match="not set yet"):
        cfg.hyperparameters()
    derived, step = step_time.choose_step(cfg, 0.0369)  # one core's batch, profiled in the run
    assert derived.emulate_step_s == 0.0123 and derived.hyperparameters()["emulate_step_s"] == 0.0123
    assert step == {"s": 0.0123, "source": "profiled", "share": 1 / 3, "batch_s": 0.0369}
    assert bench_report.step_note(step) == ("emulated step 12.3 ms: 1/3 of one core's batch (36.9 ms, profiled now), "
                                            "so the trainer's own core cannot keep up with it; pass --emulate-step-s "
                                            "to set it")
    assert step_time.choose_step(cfg, 1e-5)[0].emulate_step_s == 1e-4  # never 0 (the real CPU step)
    given, step = step_time.choose_step(BenchConfig([0], [1], emulate_step_s=0.05), 0.0369)
    assert given.emulate_step_s == 0.05 and bench_report.step_note(step) == "emulated step 50 ms (--emulate-step-s)"
    assert bench_report.step_note(step_time.choose_step(BenchConfig([0], [1], emulate_step_s=0), 0.0369)[1]) == \
        "real CPU step, none emulated (--emulate-step-s 0)"


@pytest.mark.slow  # a whole pinned local job; the slow tier's speed-up test runs four of them
@pytest.mark.serial
@two_cpus
def test_one_pinned_homogeneous_run(tmp_path):
    cfg = BenchConfig([CPUS[0]], [CPUS[1]], steps=24, warmup=4, batch_size=16, augment_repeats=1,
                      emulate_step_s=0.01, output=tmp_path, quiet_wait_s=0)
    from hetero.synthetic.mnist import write_synthetic

    write_synthetic(tmp_path / "data", 25 * 16, 0)
    r = step_time.run_mode(cfg, "homogeneous", 0, tmp_path / "data")
    assert r.ok and r.metrics["step_kind"] == "emulated" and r.metrics["steps"] == 24
    assert r.metrics["warmup_steps_discarded"] == 4 and r.step_s > 0.01
    (node,) = r.cpu
    assert node["host"] == "algo-1" and node["cpus"] == [CPUS[0]] and 0 < node["busy_share"] <= 1.05
    assert r.foreign_share is not None and 0 <= r.foreign_share <= 1


@two_cpus
@pytest.mark.slow
def test_hetero_bench_derives_its_step_from_the_batch_it_profiled_and_says_so(tmp_path, capsys, monkeypatch):
    # The runs themselves are the slow tier's (test_hetero_faster_than_homo_on_a_cpu_bound_pipeline):
    # here each returns at once with the configuration it was given.
    given = []

    def run_mode(cfg, mode, round_no, data_dir):
        given.append(cfg)
        metrics = {"avg_step_time_s": 2 * cfg.emulate_step_s, "data_wait_fraction": 0.5, "samples_per_s": 1.0,
                   "steps": cfg.steps, "warmup_steps_discarded": cfg.warmup, "step_kind": "emulated"}
        return RunResult(mode, round_no, True, 1.0, metrics, [], {}, [], 0.0)

    monkeypatch.setattr(step_time, "run_mode", run_mode)
    rc = hetero_main(["bench", "--repeats", "1", "--steps", "12", "--warmup", "2", "--batch-size", "16",
                      "--augment-repeats", "1", "--quiet-wait", "0", "--trainer-cpus", str(CPUS[0]),
                      "--data-cpus", str(CPUS[-1]), "--output", str(tmp_path), "--json", str(tmp_path / "b.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    s = json.loads((tmp_path / "b.json").read_text())
    step, profiled = s["emulated_step"], s["profiles"][0]["median_s"]  # one core's batch, profiled before the runs
    assert step["source"] == "profiled" and step["batch_s"] == profiled
    assert s["config"]["emulate_step_s"] == step["s"] == pytest.approx(profiled / 3, abs=1e-4)
    assert step["s"] < profiled and [c.emulate_step_s for c in given] == [step["s"]] * 2
    assert [c.hyperparameters()["emulate_step_s"] for c in given] == [step["s"]] * 2
    note = bench_report.step_note(step)
    assert out.startswith(note + "\n") and f"The {note}." in out, out   # before the runs, and in the report
    assert s["prediction"]["gpu_step_s"] == step["s"]


@pytest.mark.slow
@pytest.mark.serial
@two_cpus
def test_hetero_faster_than_homo_on_a_cpu_bound_pipeline(tmp_path, capsys):
    # No --emulate-step-s: the step is a third of one core's batch on this machine, profiled in this
    # run, so the homogeneous node is CPU-bound however fast the machine is.
    rc = hetero_main(["bench", "--repeats", "2", "--steps", "80", "--warmup", "10", "--trainer-cpus", str(CPUS[0]),
                      "--data-cpus", str(CPUS[1]), "--output", str(tmp_path), "--json", str(tmp_path / "b.json"),
                      "--png", str(tmp_path / "b.png"), "--quiet-wait", "30"])  # at most 30 s per run, not 120
    assert rc == 0
    s = json.loads((tmp_path / "b.json").read_text())
    step, pred = s["emulated_step"], s["prediction"]
    assert step["source"] == "profiled" and step["s"] == s["config"]["emulate_step_s"] < step["batch_s"]
    assert bench_report.step_note(step) in capsys.readouterr().out
    # the planner, from the same run's profile, expects the data core to nearly halve the step; the
    # measured speed-up must show a good part of that gain (other processes' load only shrinks it)
    # (the heterogeneous prediction takes the profile with both cores busy, which on a shared VM
    # is slower by a share of the machine's own, so "nearly halve" is anything clearly above 1)
    predicted = pred["homogeneous"]["step_s"] / pred["heterogeneous"]["step_s"]
    assert predicted > 1.25, pred
    assert s["speedup"] > 1 + (predicted - 1) / 4, bench_report.markdown(s)
    assert s["cost_ratio"] is not None and (tmp_path / "b.png").stat().st_size > 20_000


def test_epoch_boundary_cost_is_its_window_against_the_steady_median(tmp_path):
    log = tmp_path / "algo-1.log"
    lines = [f"step {s}: avg step time {0.5 if s == 24 else 0.1} s over the last 8 steps" for s in range(8, 41, 8)]
    log.write_text("\n".join(f"2026-11-23 rank 0 INFO launcher.train.step_stats: {line}" for line in lines))
    [b] = step_time.boundary_costs(log, epoch_batches=20, warmup=0)  # epoch 1 starts at step 21: window 17-24
    assert b["window"] == [17, 24] and b["first_step_of_epoch"] == 21
    assert b["steady_median_s"] == 0.1 and abs(b["extra_s"] - 3.2) < 1e-9
    runs = [{"mode": "homogeneous", "ok": True, "boundaries": [b]}]
    assert step_time.boundary_lines(runs) == ["epoch boundary, homogeneous: +3.200 s (median of 1; each: +3.200) "
                                              "over a steady 0.1000 s/step"]
    assert step_time.boundary_costs(log, epoch_batches=0, warmup=0) == []


def test_cpu_per_step_is_the_steady_state_between_logged_windows(tmp_path):
    import datetime

    from hetero.bench.cpu_monitor import NodeUsage

    base = datetime.datetime(2026, 11, 25, 12, 0, 0)
    stamp = lambda s: (base + datetime.timedelta(seconds=s)).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]  # noqa: E731
    log = tmp_path / "algo-1.log"
    log.write_text(f"{stamp(5)} algo-1 launcher.train.step_stats: step 10: avg step time 0.5 s over the last 10 steps\n"
                   f"{stamp(10)} algo-1 launcher.train.step_stats: step 20: avg step time 0.5 s over the last 10 steps\n"
                   f"{stamp(20)} algo-1 launcher.train.step_stats: step 40: avg step time 0.5 s over the last 20 steps\n")
    t0 = base.timestamp()

    class Monitor:
        nodes = {1: NodeUsage("algo-1", "dnn_group", [0], 0.0, series=[(t0, 3.0), (t0 + 30, 33.0)]),  # 1 CPU-s/s
                 2: NodeUsage("algo-2", "data_group", [1], 0.0, series=[(t0 + 12, 0.0), (t0 + 30, 18.0)])}

    # warm-up 10: the window ending at step 20 (t=10 s) starts the steady state, step 40 (t=20 s) ends it;
    # algo-2's samples begin after t=10 s, so it cannot be measured and is left out
    got = step_time.cpu_per_step(log, warmup=10, monitor=Monitor)
    assert got == {"dnn_group algo-1": pytest.approx(10.0 / 20)}
    assert step_time.cpu_per_step(log, warmup=30, monitor=Monitor) == {}  # one window: no interval
    runs = [_run("homogeneous", 0, 0.2), _run("heterogeneous", 0, 0.1)]
    runs[0].cpu_per_step_s = {"homogeneousCluster algo-1": 0.040}
    runs[1].cpu_per_step_s = {"dnn_group algo-1": 0.010, "data_group algo-2": 0.033}
    s = _summary(tmp_path, runs)
    assert s["cpu_per_step_ratio"] == pytest.approx(0.043 / 0.040)
    assert "**CPU per batch**" in bench_report.markdown(s) and "data_group 33.0 + dnn_group 10.0" in \
        bench_report.markdown(s)


def test_the_cores_a_run_had_are_measured_in_its_steady_state(tmp_path):
    import datetime

    from hetero.bench.cpu_monitor import NodeUsage

    base = datetime.datetime(2026, 11, 28, 12, 0, 0)
    stamp = lambda s: (base + datetime.timedelta(seconds=s)).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]  # noqa: E731
    log = tmp_path / "algo-1.log"
    log.write_text(f"{stamp(10)} algo-1 launcher.train.step_stats: step 20: avg step time 0.5 s over the last 10 steps\n"
                   f"{stamp(30)} algo-1 launcher.train.step_stats: step 60: avg step time 0.5 s over the last 40 steps\n")
    t0 = base.timestamp()
    mon = NodeCpuMonitor()
    # over the steady state (10 s to 30 s) core 0 is busy all the time, 0.5 of it the trainer's node; core 1 is
    # busy 0.9 of the time, 0.9 the data node's; before it (start-up) others had both cores to themselves
    mon.nodes = {1: NodeUsage("algo-1", "dnn_group", [0], 0.0, series=[(t0, 0.0), (t0 + 10, 1.0), (t0 + 30, 11.0)]),
                 2: NodeUsage("algo-2", "data_group", [1], 0.0, series=[(t0, 0.0), (t0 + 10, 1.0), (t0 + 30, 19.0)])}
    mon.core_series = [(t0, [0.0, 0.0]), (t0 + 10, [10.0, 10.0]), (t0 + 20, [20.0, 19.0]), (t0 + 30, [30.0, 28.0])]
    others = step_time.others_in_steady_state(log, warmup=10, monitor=mon)
    assert others == {0: pytest.approx(0.5), 1: pytest.approx(0.0)}
    run = _run("heterogeneous", 0, 0.1)
    run.others_steady = {str(c): o for c, o in others.items()}   # as read back from the JSON file
    assert cores_had(run, [0]) == pytest.approx(0.5) and cores_had(run, [1]) == pytest.approx(1.0)
    run.others_steady = {}                                        # not measured: the whole run's share
    assert cores_had(run, [0]) is None                            # (these fake nodes carry no CPU seconds)
