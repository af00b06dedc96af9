"""Failing fast: every option checked at start-up on every node; `hetero local` stops the job when one
node fails and prints that node's error line."""
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_service.errors import ConfigError
from hetero.local import LocalJob, run_local
from hetero.local.tree import build_nodes
from launcher.config import LaunchConfig
from launcher.node import main

from _launcher_helpers import SYNTHETIC_HPS, synth_data

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 20  # the DNN node's data_wait_s: a check that waits for data servers takes this long


@pytest.mark.parametrize("hps, message", [
    ({"evaluate": "false"}, r"evaluate='false' must look like 'package.module:name' \(or empty to disable"),
    ({"model": "Net"}, "model='Net' must look like 'package.module:name'"),
    ({"step": ""}, "step='' must look like"),
    ({"optimizer": "torch optim"}, "optimizer='torch optim' must be a name"),
    ({"lr": 0}, "lr=0.0 must be a number > 0"),
    ({"lr": "nan"}, "lr=nan must be a number > 0"),
    ({"log_level": "LOUD"}, "log_level='LOUD' must be one of DEBUG"),
    ({"dnn_group": " , "}, "dnn_group=' , ' must name at least one instance group"),
    ({"emulate_step_s": "inf"}, "emulate_step_s=inf must be a finite number"),
])
def test_option_values_are_checked_when_read(hps, message):
    with pytest.raises(ConfigError, match=message):
        LaunchConfig.from_hyperparameters(hps)
    LaunchConfig.from_hyperparameters({"evaluate": ""})  # empty: no evaluation


@pytest.fixture
def node_main(tmp_path):
    """Run the launcher's ``main`` for one emulated node in this process; restores the environment
    and logging it changes."""
    saved_env, root_logger = dict(os.environ), logging.getLogger()
    saved = (list(root_logger.handlers), root_logger.level)

    def run(role: str, **hps) -> tuple[int, float, str]:
        data = synth_data(tmp_path / "data", 400, 0)
        homogeneous = role == "homogeneous"
        nodes = build_nodes(tmp_path / "nodes", 1, 1, homogeneous, data,
                            {**SYNTHETIC_HPS, "data_wait_s": WAIT_S, **hps}, "preflight-job")
        node = next(n for n in nodes if n.role == role)
        start = time.monotonic()
        rc = main((), environ=node.env, root=str(node.root))
        failure = node.root / "output" / "failure"
        return rc, time.monotonic() - start, failure.read_text() if failure.exists() else ""

    yield run
    os.environ.clear()
    os.environ.update(saved_env)
    root_logger.handlers[:], root_logger.level = saved


@pytest.mark.parametrize("hps, message", [
    ({"pipeline": "examples.synthetic:nope"}, "pipeline='examples.synthetic:nope': module 'examples.synthetic' has "
                                              "no callable 'nope'"),
    ({"pipeline.batch_sz": 3}, "build_pipeline() got an unexpected keyword argument 'batch_sz'"),
    ({"model": "examples.mnist:Nope"}, "model='examples.mnist:Nope': module 'examples.mnist' has no attribute 'Nope'"),
    ({"model.width": 3}, "Net() got an unexpected keyword argument 'width'"),
    ({"step": "examples.nowhere:step"}, "step='examples.nowhere:step': cannot import module 'examples.nowhere'"),
    ({"evaluate": "examples.mnist:nope"}, "evaluate='examples.mnist:nope': module 'examples.mnist' has no attribute"),
    ({"optimizer": "torch.optim:Nope"}, "optimizer='torch.optim:Nope': module 'torch.optim' has no attribute"),
    ({"evaluate": "examples.mnist:MEAN"}, "evaluate='examples.mnist:MEAN' is a float, not a class or function"),
])
def test_dnn_node_checks_every_plugin_before_waiting_for_data_servers(node_main, hps, message):
    """No data server runs: a DNN node that waited for one would take data_wait_s."""
    rc, elapsed, failure = node_main("dnn", **hps)
    assert rc == 2 and message in failure, failure
    assert elapsed < WAIT_S / 2, f"took {elapsed:.1f}s: it waited for data servers first"


def test_data_node_checks_the_trainer_options_too(node_main):
    rc, elapsed, failure = node_main("data", evaluate="examples.mnist:nope", watchdog_connect_s=WAIT_S)
    assert rc == 2 and "evaluate='examples.mnist:nope'" in failure, failure
    assert elapsed < WAIT_S / 2


def test_homogeneous_node_checks_the_finish_stage_before_training(node_main):
    rc, _, failure = node_main("homogeneous", pipeline="examples.synthetic:build_finished_pipeline",
                               **{"pipeline.finish": "examples.synthetic:nope", "emulate_step_s": 0.001})
    assert rc == 2, failure  # a configuration error, found before the model is built or a batch is read
    assert "finish='examples.synthetic:nope': module 'examples.synthetic' has no callable 'nope'" in failure


@pytest.mark.slow
def test_local_run_stops_every_node_when_one_fails_and_says_why(tmp_path):
    """batch_size=0 only fails when the pipeline is built (data node); the DNN node would wait."""
    data = synth_data(tmp_path / "data", 400, 0)
    start = time.monotonic()
    result = run_local(LocalJob(data=data, output=tmp_path / "out", timeout_s=90, echo=False,
                                hyperparameters={**SYNTHETIC_HPS, "pipeline.batch_size": 0}))
    elapsed = time.monotonic() - start
    assert result.failure is not None and result.failure.startswith("algo-2 (data) exited 2: "), result.failure
    assert "batch_size" in result.failure and "ERROR" in result.failure
    assert result.exit_codes["algo-2"] == 2 and result.exit_codes["algo-1"] != 0
    assert elapsed < 45, f"{elapsed:.0f}s: the DNN node was left waiting"


@pytest.mark.slow
def test_hetero_local_prints_the_failing_nodes_error_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "HETERO_"))}
    cmd = [sys.executable, "-m", "hetero", "local", "--quiet", "--synth-train", "200", "--synth-test", "0",
           "--timeout", "90", "--output", str(tmp_path / "out"), "--hp", "pipeline=examples.synthetic:build_pipeline",
           "--hp", "pipeline.size=-5", "--hp", "data_workers=1", "--hp", "loader_workers=1"]
    start = time.monotonic()
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 1
    # the data server's workers build the pipeline (its main process never does): a configuration error
    assert ("hetero local: failed: algo-2 (data) exited 2: data@algo-2 ERROR launcher.node: launcher: data worker "
            "could not load the pipeline: ValueError: __len__() should return >= 0") in run.stderr, \
        run.stdout + run.stderr
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("hps, evaluate", [
    ({}, "examples.mnist:evaluate"),                                                   # the default model's own
    ({"model": "examples.imagefolder:resnet18"}, "examples.imagefolder:evaluate"),     # follows the model
    ({"model": "torch.nn:Linear"}, ""),                                                # its module has none
    ({"model": "examples.imagefolder:resnet18", "evaluate": ""}, ""),                  # disabled
    ({"model": "examples.imagefolder:resnet18", "evaluate": "examples.mnist:evaluate"}, "examples.mnist:evaluate"),
])
def test_the_evaluation_is_the_model_modules_own_unless_one_is_named(hps, evaluate):
    assert LaunchConfig.from_hyperparameters(hps).model.evaluate_path() == evaluate


def test_an_evaluation_that_does_not_fit_the_model_fails_at_start_naming_both_and_the_fix(tmp_path, monkeypatch):
    from launcher.job.preflight import preflight

    monkeypatch.setenv("SM_CHANNEL_TRAINING", str(synth_data(tmp_path / "mnist", 16, 8)))  # t10k: mnist evaluates
    cfg = LaunchConfig.from_hyperparameters({"model": "examples.imagefolder:resnet18", "model.num_classes": 3,
                                             "evaluate": "examples.mnist:evaluate"})
    preflight(cfg, "data")  # a data node does not evaluate
    with pytest.raises(ConfigError, match=r"^evaluate='examples.mnist:evaluate' does not fit "
                                          r"model='examples.imagefolder:resnet18': on 2 of its samples it failed with "
                                          r"RuntimeError: .*to have 3 channels.*; set evaluate=examples.imagefolder:"
                                          r"evaluate \(the model's module's own\) or evaluate= \(no evaluation\)$"):
        preflight(cfg, "dnn")


def test_a_fitting_evaluation_is_tried_and_a_missing_one_is_said_once(tmp_path, monkeypatch, caplog):
    from launcher.job.preflight import preflight

    monkeypatch.setenv("SM_CHANNEL_TRAINING", str(synth_data(tmp_path / "mnist", 16, 8)))
    with caplog.at_level(logging.INFO, logger="launcher.job.preflight"):
        preflight(LaunchConfig.from_hyperparameters({}), "dnn")
        preflight(LaunchConfig.from_hyperparameters({"model": "torch.nn:Linear", "model.in_features": 4,
                                                     "model.out_features": 2}), "dnn")
        monkeypatch.delenv("SM_CHANNEL_TRAINING")
        preflight(LaunchConfig.from_hyperparameters({}), "dnn")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("options checked")]
    assert "evaluate examples.mnist:evaluate (tried on 2 samples)" in lines[0]
    assert ("evaluate none (torch.nn has no evaluate function; evaluate=pkg.module:function names one)"
            in lines[1])
    assert "evaluate examples.mnist:evaluate (it found no evaluation data: no test accuracy)" in lines[2]
