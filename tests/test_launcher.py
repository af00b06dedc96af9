"""Launcher: options, roles, job token, CLI parsing, and data nodes' watchdog as real processes."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from data_service.errors import ConfigError
from dnn_worker import RemoteDataset
from hetero.local.runner import LocalCluster
from launcher.config import LaunchConfig, RolesSection
from launcher.serve.data_node import EXIT_CONSUMERS_GONE, EXIT_NO_CONSUMER, watchdog_for
from launcher.job.jobtoken import derive_token, job_token
from launcher.node import parse_cli
from launcher.job.roles import DATA, DNN, HOMOGENEOUS, IDLE, data_addresses, plan_roles, resolve
from launcher.job.sm_env import InstanceGroup, SageMakerEnv

from _launcher_helpers import FAST_HPS, SYNTHETIC_HPS, data_address, nodes_for, read_json, token_of

ROOT = Path(__file__).resolve().parent.parent


def env_of(current_host, groups, current_group=None):
    groups = tuple(InstanceGroup(name, "ml.x", tuple(hosts)) for name, hosts in groups.items())
    current_group = current_group or next(g.name for g in groups if current_host in g.hosts)
    hosts = tuple(h for g in groups for h in g.hosts)
    return SageMakerEnv(root="/opt/ml", current_host=current_host, current_group=current_group, hosts=hosts,
                        groups=groups, network_interface="eth0", hyperparameters={}, channels={}, model_dir="/m",
                        output_data_dir="/o", checkpoint_dir="/opt/ml/checkpoints", num_gpus=None, job_name="j",
                        sources=())


# -- options
def test_options_from_hyperparameters():
    cfg = LaunchConfig.from_hyperparameters({"epochs": "3", "homogeneous": "true", "lr": 0.5, "sagemaker_region": "x",
                                             "pipeline.batch_size": 32, "pipeline_options": '{"limit": 100}'})
    assert cfg.train.epochs == 3 and cfg.roles.homogeneous is True and cfg.model.lr == 0.5
    assert cfg.data.pipeline_options == {"limit": 100, "batch_size": 32}


# Every option users set, by the name they set it with, and a value that is not its default: these names are
# the jobs' interface (SageMaker hyperparameters, hetero local --hp, launcher/entry.py --key value).
EVERY_OPTION = {
    "data_group": "cpu_a,cpu_b", "dnn_group": "gpus", "homogeneous": True,
    "pipeline": "examples.synthetic:build_pipeline", "pipeline_options": {"size": 64}, "loader_workers": 3,
    "homogeneous_loader": "dataloader",
    "data_port": 7000, "bulk_port": 7001, "bind_host": "127.0.0.1", "data_workers": 2, "watchdog_connect_s": 30.0,
    "watchdog_idle_s": 20.0, "dnn_local_server": True, "local_server_nice": 5, "batch_window": 2_000_000_000,
    "registry": "s3://bucket/jobs/main/registry", "join": "", "advertise_host": "10.0.0.9",
    "data_wait_s": 60.0, "master_port": 29600, "procs_per_node": 2, "dist_timeout_s": 90.0, "ddp_backend": "gloo",
    "train_timeout_s": 3600.0, "connect_timeout_s": 15.0,
    "model": "examples.synthetic:TinyNet", "model_options": {"width": 8}, "step": "examples.synthetic:step",
    "evaluate": "", "optimizer": "sgd", "lr": 0.25,
    "epochs": 4, "seed": 7, "max_steps": 100, "log_every": 10, "warmup_steps": 2, "tensorboard": True,
    "audit_path": "/tmp/audit.jsonl",
    "emulate_step_s": 0.05, "emulate_step_schedule": "100:0.01",
    "advice_every": 50, "advice_prices": {"ml.c5.xlarge": 0.204}, "advice_network": {"ml.c5.xlarge": 1.25},
    "advice_flow_gbps": 10.0, "autoscale_options": {"mode": "advise"},
    "checkpoint": False, "checkpoint_dir": "/tmp/ckpt", "checkpoint_every": 500,
    "job_secret": "s3cret", "job_name": "job-7", "log_level": "DEBUG",
}


def test_every_option_keeps_the_name_users_set_it_with(tmp_path):
    """The options live in sections in the code; a job sets them by the same 52 names as ever, through
    SageMaker's hyperparameters.json (SDK v2 quotes values as JSON, v3 writes raw strings) and the
    command line alike, and reads back every value it set."""
    from launcher.job.sm_env import decode_hyperparameters, load_env

    assert set(LaunchConfig.hyperparameters()) == set(EVERY_OPTION) and len(EVERY_OPTION) == 52
    assert all(getattr(LaunchConfig(), s) != getattr(LaunchConfig.from_hyperparameters(EVERY_OPTION), s)
               for s in LaunchConfig.sections())  # each section holds a value set here
    v2 = {k: json.dumps(v) for k, v in EVERY_OPTION.items()}
    v3 = {k: v if isinstance(v, str) else json.dumps(v) for k, v in EVERY_OPTION.items()}
    for name, raw in (("v2", v2), ("v3", v3)):
        config = tmp_path / name / "input" / "config"
        config.mkdir(parents=True)
        (config / "hyperparameters.json").write_text(json.dumps(raw))
        env = load_env(str(tmp_path / name), {"SM_CURRENT_HOST": "algo-1", "SM_HOSTS": '["algo-1"]'})
        assert LaunchConfig.from_hyperparameters(env.hyperparameters).to_hyperparameters() == EVERY_OPTION, name
    argv = [a for k, v in v3.items() for a in (f"--{k}", v)]
    cfg = LaunchConfig.from_hyperparameters(decode_hyperparameters(parse_cli(argv)))
    assert cfg.to_hyperparameters() == EVERY_OPTION
    assert cfg.train.epochs == 4 and cfg.data.pipeline_options == {"size": 64} and cfg.dnn.ddp_backend == "gloo"


@pytest.mark.parametrize("hps, message", [
    ({"epoch": 3}, "unknown hyperparameter 'epoch'"),
    ({"epochs": "three"}, r"epochs='three' must be a int"),
    ({"homogeneous": "maybe"}, "homogeneous='maybe' must be a bool"),
    ({"data_port": 70000}, "data_port=70000 must be a TCP port"),
    ({"pipeline": "no_colon"}, "must look like 'package.module:function'"),
    ({"watchdog_idle_s": 0}, "watchdog_idle_s=0.0 must be > 0"),
    ({"checkpoint_every": -1}, "checkpoint_every=-1 must be >= 0"),
    ({"loader_workers": -2}, "loader_workers=-2 must be >= 0, or -1"),
    ({"checkpoint": "perhaps"}, "checkpoint='perhaps' must be a bool"),
    ({"local_server_nice": 20}, "local_server_nice=20 must be 0..19"),
])
def test_bad_options_name_the_value(hps, message):
    with pytest.raises(ConfigError, match=message):
        LaunchConfig.from_hyperparameters(hps)


def test_loader_workers_default_to_none_where_batches_arrive_built():
    # homogeneous: the node's own data server builds (2 workers per rank), the trainer takes them built
    cfg = LaunchConfig.from_hyperparameters({})
    assert cfg.data.workers_for("homogeneous") == 0 and cfg.data.workers_for("heterogeneous") == 0
    assert cfg.data.homogeneous_server_workers(nprocs=1) == 2 and cfg.data.homogeneous_server_workers(nprocs=4) == 8
    cfg = LaunchConfig.from_hyperparameters({"loader_workers": "3"})
    assert cfg.data.workers_for("homogeneous") == 0 and cfg.data.homogeneous_server_workers(1) == 3
    assert cfg.data.workers_for("heterogeneous") == 3
    # DataLoader workers instead, or everything in the trainer
    cfg = LaunchConfig.from_hyperparameters({"homogeneous_loader": "dataloader"})
    assert cfg.data.workers_for("homogeneous") == 2 and cfg.data.homogeneous_server_workers(1) == 0
    cfg = LaunchConfig.from_hyperparameters({"loader_workers": "0"})
    assert cfg.data.workers_for("homogeneous") == 0 and cfg.data.homogeneous_server_workers(1) == 0
    with pytest.raises(ConfigError, match="homogeneous_loader='threads' must be 'server'"):
        LaunchConfig.from_hyperparameters({"homogeneous_loader": "threads"})


def test_cli_arguments_as_sagemaker_passes_them():
    assert parse_cli(["--epochs", "3", "--data-port=7000", "--pipeline.batch_size", "8"]) == {
        "epochs": "3", "data_port": "7000", "pipeline.batch_size": "8"}
    with pytest.raises(ConfigError, match="has no value"):
        parse_cli(["--epochs"])


# -- roles
def test_roles_by_group_name_whatever_the_host_order():
    groups = {"dnn_group": ["algo-3", "algo-1"], "data_group": ["algo-2"]}
    cfg = LaunchConfig()
    data = plan_roles(env_of("algo-2", groups), cfg)
    assert data.role == DATA and data.data_hosts == ("algo-2",)
    dnn = plan_roles(env_of("algo-3", groups), cfg)
    assert dnn.role == DNN and dnn.dnn_hosts == ("algo-1", "algo-3") and dnn.node_rank == 1  # natural order
    assert data_addresses(dnn, cfg, {}) == ["algo-2:6000"]
    assert data_addresses(dnn, cfg, {"algo-2": "127.0.0.1:4100"}) == ["127.0.0.1:4100"]


def test_homogeneous_by_single_group_or_option():
    plan = plan_roles(env_of("algo-1", {"homogeneousCluster": ["algo-2", "algo-1"]}), LaunchConfig())
    assert plan.role == HOMOGENEOUS and plan.node_rank == 0 and plan.mode == "homogeneous"
    groups = {"data_group": ["algo-1"], "dnn_group": ["algo-2"]}
    forced = LaunchConfig(roles=RolesSection(homogeneous=True))
    assert plan_roles(env_of("algo-2", groups), forced).role == HOMOGENEOUS
    assert plan_roles(env_of("algo-1", groups), forced).role == IDLE


@pytest.mark.parametrize("groups, host, cfg, message", [
    ({"cpu": ["algo-1"], "gpu": ["algo-2"]}, "algo-1", LaunchConfig(),
     r"group 'cpu' is neither a data group \(data_group='data_group'\).*\['cpu', 'gpu'\]"),
    ({"data_group": ["algo-1"], "gpu": ["algo-2"]}, "algo-1", LaunchConfig(),
     "dnn_group='dnn_group' names no instance group of this job"),
    ({"data_group": ["algo-1"], "dnn_group": []}, "algo-1", LaunchConfig(), "'dnn_group' .* has no hosts"),
    ({"data_group": ["algo-1"]}, "algo-1", LaunchConfig(), "only instance group 'data_group' is a data group"),
    ({"a": ["algo-1"], "b": ["algo-2"]}, "algo-1", LaunchConfig(roles=RolesSection(data_group="a", dnn_group="a")), "both"),
])
def test_role_errors(groups, host, cfg, message):
    with pytest.raises(ConfigError, match=message):
        plan_roles(env_of(host, groups), cfg)


def test_host_map_resolution():
    assert resolve("algo-1", 6000, {}) == ("algo-1", 6000)
    assert resolve("algo-1", 6000, {"algo-1": "127.0.0.1"}) == ("127.0.0.1", 6000)
    assert resolve("algo-1", 6000, {"algo-1": "127.0.0.1:41000"}) == ("127.0.0.1", 41000)


# -- token
def test_job_token_is_an_hmac_of_the_job_name():
    import hashlib
    import hmac
    expected = hmac.new(b"s3cret", b"hetero-data-service/v1/job-token:job-7", hashlib.sha256).hexdigest()
    assert job_token({"HETERO_JOB_SECRET": "s3cret"}, "job-7") == expected == derive_token("s3cret", "job-7")
    assert job_token({}, "job-7", secret_hp="s3cret") == expected
    assert job_token({"HETERO_JOB_SECRET": "s3cret"}, "job-8") != expected
    assert job_token({"HETERO_JOB_TOKEN": "explicit"}, "") == "explicit"
    with pytest.raises(ConfigError, match="no training job name"):
        job_token({"HETERO_JOB_SECRET": "s"}, "")


# -- watchdog
def test_watchdog_verdicts():
    w = watchdog_for(LaunchConfig.from_hyperparameters({"watchdog_connect_s": 10, "watchdog_idle_s": 5}))
    assert w.verdict(False, 9.0, 9.0) is None
    assert w.verdict(False, 11.0, 11.0)[0] == EXIT_NO_CONSUMER
    assert w.verdict(True, -1.0, 1000.0) is None  # a consumer is connected
    assert w.verdict(True, 4.0, 1000.0) is None
    assert w.verdict(True, 6.0, 1000.0)[0] == EXIT_CONSUMERS_GONE


def run_data_node_only(tmp_path, base=SYNTHETIC_HPS, bare=False, **hps):
    nodes = nodes_for(tmp_path, base=base, **hps)
    data = next(n for n in nodes if n.role == "data")
    if bare:  # a container without the training toolkit: the files, no SM_* variables
        data.env = {k: v for k, v in data.env.items() if not k.startswith("SM_")}
    cluster = LocalCluster([data], hps, tmp_path / "logs", echo=False)
    cluster.start()
    return cluster, data


@pytest.mark.slow
def test_data_node_whose_consumer_never_comes_exits_nonzero(tmp_path):
    # the MNIST pipeline in a bare container: it finds its channel from the files alone
    cluster, data = run_data_node_only(tmp_path, base=FAST_HPS, bare=True, watchdog_connect_s=3)
    start = time.monotonic()
    codes = cluster.wait(timeout_s=90)
    assert codes[data.host] == EXIT_NO_CONSUMER, (tmp_path / "logs" / f"{data.host}.log").read_text()
    assert time.monotonic() - start < 60
    log = (tmp_path / "logs" / f"{data.host}.log").read_text()
    assert "healthy: serving examples.mnist:build_pipeline" in log
    report = read_json(data.output_dir / "data_node.json")
    assert report["exit_code"] == EXIT_NO_CONSUMER and "no consumer connected" in report["reason"]


@pytest.mark.slow  # the data node's watchdog runs by default in test_data_node_whose_consumer_never_comes_exits_nonzero
def test_data_node_whose_consumers_left_exits_nonzero(tmp_path):
    cluster, data = run_data_node_only(tmp_path, watchdog_idle_s=2)
    try:
        ds = RemoteDataset([data_address(data)], token_of(data), seed=0, connect_timeout=60)
        batches = list(DataLoader(ds, batch_size=None, num_workers=0))
        assert len(batches) == 400 // 8  # the whole epoch
    finally:
        codes = cluster.wait(timeout_s=60)
    assert codes[data.host] == EXIT_CONSUMERS_GONE
    assert "all consumers gone" in read_json(data.output_dir / "data_node.json")["reason"]


def test_entry_point_reports_a_missing_job_description(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "HETERO_"))}
    env["HETERO_SM_ROOT"] = str(tmp_path)
    proc = subprocess.run([sys.executable, str(ROOT / "launcher" / "entry.py"), "--epochs", "1"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "resourceconfig.json does not exist" in proc.stderr


def test_tensorboard_without_the_extra_is_a_clear_error(tmp_path):
    pytest.importorskip("torch")
    try:
        import tensorboard  # noqa: F401
        pytest.skip("tensorboard is installed")
    except ImportError:
        pass
    from launcher.train.trainer import TrainJob, _tensorboard
    job = TrainJob(cfg=LaunchConfig(), mode="homogeneous", host="algo-1", dnn_hosts=("algo-1",), node_rank=0,
                   nprocs=1, master_addr="127.0.0.1", model_dir=str(tmp_path), output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"tensorboard=true needs the tensorboard package"):
        _tensorboard(job)


def test_a_server_beside_the_trainers_builds_at_the_local_server_nice_value():
    from launcher.serve.server import start_server

    cfg = LaunchConfig.from_hyperparameters({"pipeline": "examples.synthetic:build_pipeline", "pipeline.size": 64,
                                             "local_server_nice": "6"})
    own = os.getpriority(os.PRIO_PROCESS, 0)
    for beside, nice in ((True, min(19, own + 6)), (False, own)):
        server = start_server(cfg, "t" * 32, 0, host="127.0.0.1", workers=1, beside_trainer=beside)
        try:
            assert [os.getpriority(os.PRIO_PROCESS, p) for p in server.pool.worker_pids()] == [nice]
        finally:
            server.shutdown(grace_s=1)
