"""The launcher with a registry: options, a data-only job's roles, data nodes that register, and a
``hetero local`` job that a ``hetero serve --join`` server joins mid-run."""
from __future__ import annotations

import threading
import time

import pytest

from data_service.membership import registry
from data_service.errors import ConfigError
from dnn_worker import RemoteDataset
from hetero.local.runner import LocalCluster
from launcher.config import ElasticSection, LaunchConfig
from launcher.serve.data_node import EXIT_CONSUMERS_GONE, EXIT_NO_CONSUMER, watchdog_for
from launcher.job.roles import DATA, plan_roles

from _launcher_helpers import SYNTHETIC_HPS, nodes_for, read_json, token_of
from test_launcher import env_of


@pytest.mark.parametrize("hps, message", [
    ({"registry": "/r", "join": "/j"}, "set one of them"),
    ({"registry": "http://x/y"}, "registry='http://x/y': only a local folder or s3://"),
    ({"join": "s3://-bad/x"}, "valid bucket"),
])
def test_registry_options_are_checked(hps, message):
    with pytest.raises(ConfigError, match=message):
        LaunchConfig.from_hyperparameters(hps)


def test_a_data_only_job_that_joins_has_only_data_nodes():
    cfg = LaunchConfig(elastic=ElasticSection(join="s3://bucket/jobs/main/registry"))
    for groups in ({"data_group": ["algo-2", "algo-1"]}, {"homogeneousCluster": ["algo-1"]}):
        plan = plan_roles(env_of("algo-1", groups), cfg)
        assert plan.role == DATA and plan.dnn_hosts == ()


def test_a_joined_node_has_no_first_consumer_deadline_and_ends_cleanly_when_idle():
    hps = {"watchdog_connect_s": 10, "watchdog_idle_s": 5}
    w = watchdog_for(LaunchConfig.from_hyperparameters({**hps, "join": "/r"}))
    assert w.verdict(False, 1e6, 1e6) is None
    assert w.verdict(True, 4.0, 1e6) is None
    code, reason = w.verdict(True, 6.0, 1e6)
    assert code == 0 and "the last job has left" in reason
    own = watchdog_for(LaunchConfig.from_hyperparameters(hps))  # the job's own data node
    assert own.verdict(False, 11.0, 11.0)[0] == EXIT_NO_CONSUMER and own.verdict(True, 6.0, 1e6)[0] == EXIT_CONSUMERS_GONE


def test_a_sweeps_data_job_gives_up_when_no_job_ever_comes_and_ends_cleanly_after_the_last():
    sweep = watchdog_for(LaunchConfig.from_hyperparameters({"join": "/r", "batch_window": "1GB",
                                                             "watchdog_connect_s": 10, "watchdog_idle_s": 5}))
    code, reason = sweep.verdict(False, 1e6, 11.0)
    assert code == EXIT_NO_CONSUMER and "watchdog_connect_s=10" in reason
    assert sweep.verdict(True, 6.0, 1e6)[0] == 0
    autoscaled = watchdog_for(LaunchConfig.from_hyperparameters({"join": "/r", "watchdog_connect_s": 10}))
    assert autoscaled.verdict(False, 1e6, 1e6) is None  # joins a running job: waits for it


def test_trainers_read_the_registry_with_the_jobs_fingerprint(tmp_path):
    from data_service.contract.pipeline import PipelineSpec
    from launcher.train.trainer import TrainJob, make_dataset

    cfg = LaunchConfig.from_hyperparameters({**SYNTHETIC_HPS, "registry": str(tmp_path)})
    job = TrainJob(cfg=cfg, mode="heterogeneous", host="algo-1", dnn_hosts=("algo-1",), node_rank=0, nprocs=1,
                   master_addr="127.0.0.1", model_dir="", output_dir="", token="t", servers=("algo-2:6000",))
    ds = make_dataset(job, 0)
    assert ds.registry == str(tmp_path) and ds.servers == ["algo-2:6000"]
    assert ds.fingerprint == PipelineSpec(cfg.data.pipeline, cfg.data.pipeline_options).fingerprint()
    plain = make_dataset(TrainJob(**{**job.__dict__, "cfg": LaunchConfig.from_hyperparameters(SYNTHETIC_HPS)}), 0)
    assert plain.registry is None


@pytest.mark.slow  # a whole process tree: the slow tier
def test_a_data_node_joining_another_job_registers_serves_and_leaves_cleanly(tmp_path):
    reg = tmp_path / "registry"
    nodes = nodes_for(tmp_path, base=SYNTHETIC_HPS, join=str(reg), job_name="test-job", watchdog_idle_s=2,
                      watchdog_connect_s=1)
    data = next(n for n in nodes if n.role == "data")
    cluster = LocalCluster([data], {}, tmp_path / "logs", echo=False)
    cluster.start()
    try:
        ds = RemoteDataset(None, token_of(data), registry=str(reg), seed=0, connect_timeout=60)
        assert len(list(ds)) == 400 // 8
        entries, _ = registry.read_entries(str(reg))
        assert [e.address.split(":")[0] for e in entries] == ["127.0.0.1"]  # its bind host
        assert registry.verify(entries[0], token_of(data), ds.hello().dataset.fingerprint) is None
    finally:
        codes = cluster.wait(timeout_s=60)
    assert codes[data.host] == 0, (tmp_path / "logs" / f"{data.host}.log").read_text()[-2000:]
    assert "the last job has left" in read_json(data.output_dir / "data_node.json")["reason"]
    assert registry.read_entries(str(reg)) == ([], [])  # it unregistered when it left


@pytest.mark.slow  # a whole local job (two processes) and a joining server process
def test_a_joined_server_serves_a_local_job_then_is_killed_and_every_batch_is_trained_once(tmp_path, monkeypatch):
    """``hetero local --registry`` with a ``hetero serve --join`` server: the trainer uses it beside the
    job's own data node; killed -9 mid-epoch, its batches go to the job's node, each trained once."""
    from hetero.local import LocalJob, run_local
    from hetero.testing import ServerProc, check_audit

    monkeypatch.setenv("HETERO_JOB_TOKEN", "local-registry-token")
    options = {"size": 640, "batch_size": 8}
    hps = {"pipeline": "examples.synthetic:build_pipeline", "pipeline.size": 640, "pipeline.batch_size": 8,
           "data_workers": 1, "loader_workers": 0, "emulate_step_s": 0.1, "warmup_steps": 1, "evaluate": ""}
    reg = tmp_path / "registry"
    reg.mkdir()
    audit = tmp_path / "audit.jsonl"
    joiner = ServerProc(options, token="local-registry-token", log_path=tmp_path / "joiner.log")
    joiner.cmd += ["--join", str(reg), "--advertise-host", "127.0.0.1"]
    joiner.start()
    job = LocalJob(data_nodes=1, dnn_nodes=1, output=tmp_path / "out", audit=audit, hyperparameters=hps,
                   timeout_s=180, echo=False, registry=reg, synth_train=16, synth_test=16)
    box = {}
    runner = threading.Thread(target=lambda: box.update(result=run_local(job)), daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 90
        while _sent(joiner) < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        sent = _sent(joiner)
        rows = audit.read_text().count("\n") if audit.exists() else 0
        joiner.kill()
        runner.join(150)
    finally:
        joiner.stop()
    result = box["result"]
    assert result.ok, result.failure
    assert sent >= 5 and rows < 70, (sent, rows)  # killed mid-epoch, after it had served the trainer
    counts = check_audit(audit, options, seed=0)
    assert counts["lost"] == counts["duplicated"] == counts["corrupt"] == 0 and counts["delivered"] == 80


def _sent(server) -> int:
    from dnn_worker.transport.control import ControlClient

    with ControlClient(server.address, server.token) as ctl:
        return ctl.stats().batches_sent


def test_hetero_local_registry_gives_the_job_a_token_a_joining_server_can_use(tmp_path, monkeypatch, caplog):
    import logging

    from hetero.local import LocalJob, open_registry

    caplog.set_level(logging.INFO)
    monkeypatch.delenv("HETERO_JOB_TOKEN", raising=False)
    hps = {"pipeline": "examples.synthetic:build_pipeline", "pipeline.size": 640}
    env = open_registry(LocalJob(registry=tmp_path / "reg"), hps, tmp_path)
    token_file = tmp_path / "job_token"
    assert env == {"HETERO_JOB_TOKEN": token_file.read_text().strip()} and len(env["HETERO_JOB_TOKEN"]) == 32
    assert token_file.stat().st_mode & 0o077 == 0  # its owner's only
    assert hps["registry"] == str((tmp_path / "reg").resolve()) and (tmp_path / "reg").is_dir()
    assert f"hetero serve examples.synthetic:build_pipeline -o size='640' --port 0 --join {hps['registry']}" in caplog.text
    monkeypatch.setenv("HETERO_JOB_TOKEN", "from-the-environment")
    assert open_registry(LocalJob(registry=tmp_path / "reg"), dict(hps), tmp_path) == {
        "HETERO_JOB_TOKEN": "from-the-environment"}
    with pytest.raises(ConfigError, match="homogeneous job has no data servers"):
        open_registry(LocalJob(registry=tmp_path / "reg", homogeneous=True), dict(hps), tmp_path)
