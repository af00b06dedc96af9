"""``hetero local``: whole jobs as real processes (one per emulated node) on loopback."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from examples.mnist import Net
from hetero.local import LocalJob, run_local

from _launcher_helpers import FAST_HPS, read_json, synth_data

ROOT = Path(__file__).resolve().parent.parent


def local_job(tmp_path, data, **kw) -> LocalJob:
    hps = {**FAST_HPS, **kw.pop("hps", {})}
    return LocalJob(data=data, output=tmp_path / "out", hyperparameters=hps, timeout_s=240, echo=False, **kw)


def logs_of(result) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted((result.output / "logs").glob("*.log")))


@pytest.mark.slow  # a real model trains through a data server in test_imagefolder.py (ResNet-18) by default
def test_one_data_node_trains_the_mnist_cnn(tmp_path):
    data = synth_data(tmp_path / "data", train=1600, test=400)  # 200 steps of 8 images
    result = run_local(local_job(tmp_path, data, data_nodes=1, dnn_nodes=1))
    assert result.ok, logs_of(result)
    m = result.metrics
    assert m["mode"] == "heterogeneous" and m["step_kind"] == "real" and m["world_size"] == 1
    assert m["steps"] == 200 and m["warmup_steps_discarded"] == 5
    assert m["avg_step_time_s"] > 0 and 0 <= m["data_wait_fraction"] <= 1 and m["samples_per_s"] > 0
    assert m["test_accuracy"] > 0.2, m  # learnt something: chance is 0.1
    data_nodes = [n for n in m["nodes"] if n["role"] == "data"]
    assert [n["batches_sent"] for n in data_nodes] == [200]
    model_files = list(result.output.glob("algo-*/model/model.pt"))
    assert len(model_files) == 1
    Net().load_state_dict(torch.load(model_files[0]))
    data_host = data_nodes[0]["host"]
    assert read_json(result.output / data_host / "output" / "data_node.json")["reason"] == "shut down"


@pytest.mark.slow  # test_metric_definitions.py and test_preflight.py run whole local jobs by default
def test_two_data_nodes_share_the_work_with_an_emulated_step(tmp_path):
    data = synth_data(tmp_path / "data", train=2400, test=0)  # 300 steps
    audit = tmp_path / "audit.jsonl"
    result = run_local(local_job(tmp_path, data, data_nodes=2, dnn_nodes=1, audit=audit,
                                 hps={"emulate_step_s": 0.005, "data_workers": 1}))
    assert result.ok, logs_of(result)
    m = result.metrics
    assert m["step_kind"] == "emulated" and m["emulate_step_s"] == 0.005 and m["test_accuracy"] is None
    assert m["steps"] == 300 and m["avg_step_time_s"] >= 0.005
    sent = [n["batches_sent"] for n in m["nodes"] if n["role"] == "data"]
    # a server quiet for a second on a loaded machine gets its head batch hedged: a copy is sent
    # twice and dropped once; the audit below shows each batch was trained on exactly once
    assert len(sent) == 2 and 300 <= sum(sent) <= 315 and min(sent) > 0, sent
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert sorted(line["batch"] for line in lines) == list(range(300))
    assert set(result.exit_codes.values()) == {0}


@pytest.mark.slow
def test_trainer_crash_still_shuts_the_data_nodes_down(tmp_path):
    data = synth_data(tmp_path / "data", train=800, test=0)
    start = time.monotonic()
    result = run_local(local_job(tmp_path, data, data_nodes=1, dnn_nodes=1,
                                 hps={"step": "launcher.train.faults:crash_step"}))
    codes = result.exit_codes
    assert codes["algo-1"] == 1 and codes["algo-2"] == 0, (codes, logs_of(result))
    assert read_json(result.output / "algo-2" / "output" / "data_node.json")["reason"] == "shut down"
    assert "InjectedFault" in (result.output / "logs" / "algo-1.log").read_text()
    assert "training failed on algo-1" in (result.output / "logs" / "algo-2.log").read_text()
    assert time.monotonic() - start < 120  # not the runner's kill after its grace period
    assert result.metrics is None


@pytest.mark.slow  # a whole job with two local ranks
def test_a_trainer_aborting_at_exit_after_it_reported_does_not_fail_the_job(tmp_path):
    data = synth_data(tmp_path / "data", train=800, test=0)
    result = run_local(local_job(tmp_path, data, data_nodes=1, dnn_nodes=1,
                                 hps={"step": "launcher.train.faults:abort_at_exit_step", "procs_per_node": 2,
                                      "loader_workers": 0}))
    assert result.ok and set(result.exit_codes.values()) == {0}, (result.exit_codes, logs_of(result))
    log = (result.output / "logs" / "algo-1.log").read_text()
    assert "exited with signal SIGABRT after it had finished and reported" in log, log[-3000:]


@pytest.mark.slow  # test_bench.py runs a pinned homogeneous job by default
def test_homogeneous_baseline_from_the_command_line(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "HETERO_"))}
    cmd = [sys.executable, "-m", "hetero", "local", "--homogeneous", "--synth-train", "800", "--synth-test", "200",
           "--output", str(out), "--quiet", "--seed", "3"] + [f"--hp={k}={v}" for k, v in FAST_HPS.items()]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "homogeneous: avg step time" in proc.stdout
    m = read_json(out / "metrics.json")
    assert m["mode"] == "homogeneous" and m["steps"] == 100 and m["seed"] == 3
    # the node built its batches in a data server of its own, on loopback
    assert len(m["data_servers"]) == 1 and m["data_servers"][0].startswith("127.0.0.1:")
    assert (out / "algo-1" / "model" / "model.pt").is_file()


@pytest.mark.slow
def test_ddp_across_two_dnn_nodes_and_two_local_ranks(tmp_path):
    data = synth_data(tmp_path / "data", train=1600, test=400)
    result = run_local(local_job(tmp_path, data, data_nodes=1, dnn_nodes=2, hps={"procs_per_node": 2,
                                                                                   "loader_workers": 0}))
    assert result.ok, logs_of(result)
    m = result.metrics
    assert m["world_size"] == 4 and m["steps"] == 50 and m["total_steps"] == 200
    ranks = {n["host"]: [r["rank"] for r in n["ranks"]] for n in m["nodes"] if n["role"] == "dnn"}
    assert ranks == {"algo-1": [0, 1], "algo-2": [2, 3]}
    assert [n["batches_sent"] for n in m["nodes"] if n["role"] == "data"] == [200]


@pytest.mark.slow  # every node stopping at the end runs by default in test_trainer_crash_still_shuts_the_data_nodes_down
@pytest.mark.serial  # it checks all of /dev/shm: another test's DataLoader semaphores there would count against it
def test_ctrl_c_stops_every_node_process(tmp_path):
    psutil = pytest.importorskip("psutil")
    import signal
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "HETERO_"))}
    cmd = [sys.executable, "-m", "hetero", "local", "--data-nodes", "1", "--synth-train", "400", "--synth-test", "0",
           "--output", str(tmp_path / "out"), "--epochs", "1000", "--hp", "emulate_step_s=0.05",
           "--hp", "pipeline=examples.synthetic:build_pipeline", "--hp", "data_workers=1", "--hp", "loader_workers=1"]
    shm = Path("/dev/shm")
    before = set(os.listdir(shm)) if shm.is_dir() else set()
    # SIGINT as a terminal's Ctrl-C sends it, whatever this run inherited: a shell's background
    # job starts with SIGINT ignored, and the runner would inherit that.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:  # wait until training runs: every node and worker is up
            if "training:" in line:
                break
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 4  # two launchers, a server worker, a loader worker
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # failed: leave no node running to disturb later tests
            for p in [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True):
                try:
                    p.kill()
                except psutil.Error:
                    pass
    assert proc.returncode == 130, out
    gone, alive = psutil.wait_procs(tree, timeout=15)
    assert not alive, [p.cmdline() for p in alive]
    if shm.is_dir():  # the loader's semaphores too: resource trackers must outlive what they clean
        assert not set(os.listdir(shm)) - before
