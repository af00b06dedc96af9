"""A sweep as ``hetero sweep`` submits it, run as processes (``hetero local --jobs/--vary``): one
data-only job and DNN-only jobs that read it through the registry, each job exact."""
from __future__ import annotations

import json

import pytest

from data_service.errors import ConfigError
from hetero.local import LocalJob
from hetero.local.sweep import run_local_sweep
from launcher.config import LaunchConfig
from launcher.job.roles import DNN, HOMOGENEOUS, plan_roles

from test_launcher import env_of

SMALL = {"pipeline.batch_size": 64, "evaluate": "", "emulate_step_s": 0.01, "checkpoint": False}


def test_a_dnn_only_job_with_a_registry_trains_from_it_and_a_single_group_without_one_is_homogeneous():
    env = env_of("algo-1", {"dnn_group": ["algo-2", "algo-1"]})
    plan = plan_roles(env, LaunchConfig.from_hyperparameters({"registry": "/r"}))
    assert (plan.role, plan.shared_group, plan.data_hosts, plan.dnn_hosts, plan.node_rank) == (
        DNN, True, (), ("algo-1", "algo-2"), 0)
    assert plan.mode == "heterogeneous"
    assert plan_roles(env, LaunchConfig()).role == HOMOGENEOUS
    assert plan_roles(env, LaunchConfig.from_hyperparameters({"registry": "/r", "homogeneous": True})).role == HOMOGENEOUS
    lone = env_of("algo-1", {"homogeneousCluster": ["algo-1"]})  # not named dnn_group: trains in-process
    assert plan_roles(lone, LaunchConfig.from_hyperparameters({"registry": "/r"})).role == HOMOGENEOUS


def test_a_dnn_only_job_whose_registry_lists_no_server_gives_up_at_its_deadline_naming_the_registry(tmp_path):
    from data_service.errors import ServerUnavailableError
    from launcher.train.dnn_node import wait_registry

    with pytest.raises(ServerUnavailableError, match=f"registry {tmp_path} listed no data server .* data_wait_s=0.1s"):
        wait_registry(str(tmp_path), "token", "fingerprint", 0.1)


def test_the_sweeps_data_job_takes_its_batch_window_and_a_bad_size_names_the_value():
    from hetero.sagemaker.sweep import Sweep, sweep_hyperparameters

    data, jobs = sweep_hyperparameters({"seed": "1"}, Sweep("s", "/r", "8GB", 600, ((("lr", "0.1"),),)))
    assert LaunchConfig.from_hyperparameters(data).serve.batch_window == 8_000_000_000
    assert LaunchConfig.from_hyperparameters(jobs[0]).model.lr == 0.1
    with pytest.raises(ConfigError, match="batch_window='8 gigs' must be a size"):
        LaunchConfig.from_hyperparameters({"batch_window": "8 gigs"})


def test_a_sweep_refuses_options_it_cannot_take(tmp_path):
    with pytest.raises(ConfigError, match="drop --homogeneous"):
        run_local_sweep(LocalJob(homogeneous=True, output=tmp_path), jobs=2)
    with pytest.raises(ConfigError, match="--jobs N"):
        run_local_sweep(LocalJob(output=tmp_path))
    with pytest.raises(ConfigError, match="change the pipeline"):
        run_local_sweep(LocalJob(output=tmp_path), vary=["pipeline.batch_size=8,16"])


@pytest.mark.slow  # three launchers, a data node's workers and two trainers
def test_two_jobs_of_one_seed_read_one_data_job_each_exact_and_the_first_to_end_leaves_it_serving(tmp_path):
    """Job 0 trains 1 epoch, job 1 trains 2, so job 0 ends first: it leaves the data group serving
    (a job that shut it down would end it on that shutdown, not on its idle timeout). Both trained
    every batch once, the same batches; the data job built each batch of epoch 0 once for both."""
    job = LocalJob(data_nodes=1, dnn_nodes=1, synth_train=512, synth_test=64, hyperparameters=SMALL,
                   output=tmp_path / "out", audit=tmp_path / "audit", echo=False, timeout_s=240)
    result = run_local_sweep(job, vary=["epochs=1,2"], batch_window="64MB", idle_s=3.0)
    logs = {name: r.output for name, r in result.jobs.items()}
    assert result.ok, (result.data.failure, {n: r.failure for n, r in result.jobs.items()}, logs)
    first, second = result.jobs.values()
    assert first.metrics["mode"] == second.metrics["mode"] == "heterogeneous"
    audits = {name: [json.loads(line) for line in open(tmp_path / "audit" / f"{name}.jsonl")]
              for name in result.jobs}
    one, two = audits.values()
    per_epoch = 512 // 64
    assert sorted((a["epoch"], a["batch"]) for a in one) == [(0, b) for b in range(per_epoch)]
    assert sorted((a["epoch"], a["batch"]) for a in two) == [(e, b) for e in range(2) for b in range(per_epoch)]
    digests = {(a["epoch"], a["batch"]): a["sha256"] for a in two}
    assert all(digests[(a["epoch"], a["batch"])] == a["sha256"] for a in one)  # one seed: the same batches
    (node,) = result.data_nodes.values()
    assert node["exit_code"] == 0 and "gone" in node["reason"]
    assert node["batches_sent"] == 3 * per_epoch
    # epoch 0 built once for both jobs (at most build-ahead's few batches more, unasked)
    assert node["batches_built"] < 3 * per_epoch and node["window"]["built_again"] == 0
    assert "left serving the other jobs" in (result.jobs[next(iter(result.jobs))].output / "logs" / "algo-1.log").read_text()
