"""The SageMaker Python SDK v3 ModelTrainer built from a JobSpec, submitted with no AWS at all.

Every AWS call the SDK makes goes through botocore's event hooks: ``before-parameter-build``
records the API parameters, ``before-call`` answers with a canned 200 (so nothing is
serialized onto the network) and a ``before-send`` hook fails the test if a request would
still leave. Sockets are refused too. The captured CreateTrainingJob is then checked against
botocore's service model and the API rules, group by group and channel by channel.
"""
from __future__ import annotations

import datetime
import os
import socket

import boto3
import pytest

from hetero.sagemaker import sdk_version
from hetero.sagemaker.spec import Channel, Group, JobSpec, SubmitError
from hetero.sagemaker.validate import botocore_errors, check_request
from launcher.metric_lines import METRIC_DEFINITIONS

if sdk_version.sdk_problem() is not None:
    pytest.skip(f"SageMaker SDK tests: {sdk_version.sdk_problem()}", allow_module_level=True)

from hetero.sagemaker.sdk import model_trainer  # noqa: E402

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/hetero:1"
ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hetero-job-AbCdEf"
GROUPS = [Group("data_group", "ml.c5.9xlarge", 2, "data"), Group("dnn_group", "ml.p3.2xlarge", 1, "dnn")]


class _Http:
    status_code = 200
    headers: dict = {}
    content = b""
    raw = None


class FakeAWS:
    """Records each call's API parameters and answers it without the network."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []

    def record(self, params, model, **_):
        self.calls.append((model.service_model.service_name, model.name, dict(params)))

    def answer(self, model, params, **_):
        name = model.name
        out: dict = {"ResponseMetadata": {"HTTPStatusCode": 200}}
        if name == "GetCallerIdentity":
            out.update(Account="123456789012", Arn="arn:aws:iam::123456789012:user/u", UserId="u")
        elif name == "ListBuckets":
            out["Buckets"] = [{"Name": "bkt", "CreationDate": datetime.datetime(2026, 1, 1)}]
        elif name == "CreateTrainingJob":
            out["TrainingJobArn"] = f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{self.job()['TrainingJobName']}"
        elif name == "DescribeTrainingJob":
            job = self.job()
            out.update(TrainingJobName=job["TrainingJobName"], TrainingJobStatus="InProgress",
                       SecondaryStatus="Starting", CreationTime=datetime.datetime(2026, 11, 23),
                       TrainingJobArn=f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{job['TrainingJobName']}")
        return _Http(), out

    @staticmethod
    def refuse_send(request, **_):
        raise AssertionError(f"a request would have been sent: {request.url}")

    def job(self) -> dict:
        jobs = [p for s, n, p in self.calls if n == "CreateTrainingJob"]
        assert len(jobs) == 1, [n for _, n, _ in self.calls]
        return jobs[0]

    def uploads(self) -> list[str]:
        return [f"s3://{p['Bucket']}/{p['Key']}" for s, n, p in self.calls if n == "PutObject"]


@pytest.fixture
def aws(monkeypatch, tmp_path):
    config = tmp_path / "sagemaker.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n")
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(config))  # no telemetry call
    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")             # no IAM GetRole from the constructor
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)

    def no_network(*args, **kwargs):
        raise AssertionError(f"network connection attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    fake = FakeAWS()
    session = boto3.session.Session(region_name="us-east-1")
    session.events.register("before-parameter-build.*.*", fake.record)
    session.events.register("before-call.*.*", fake.answer)
    session.events.register("before-send.*.*", fake.refuse_send)
    return fake, session


def spec(**kw) -> JobSpec:
    base = dict(job_name="nb", role=ROLE, image=IMAGE, region="us-east-1", output="s3://bkt/out", groups=list(GROUPS),
                channels=[Channel("train", "s3://bkt/images", ("data_group",), "FastFile"),
                          Channel("test", "s3://bkt/test", ("data_group", "dnn_group"))],
                source_s3="s3://bkt/out/nb/source/sourcedir.tar.gz", job_secret="feedface" * 4,
                hyperparameters={"epochs": "2", "tensorboard": "true", "pipeline.batch_size": "16",
                                 "pipeline_options": '{"blur_kernel": 3, "batch_size": 8}'},
                spot=True, tags={"team": "ml"})
    base.update(kw)
    return JobSpec(**base)


@pytest.mark.slow
def test_a_vpc_reaches_the_request(aws):
    fake, session = aws
    vpc = {"Subnets": ["subnet-0aaa"], "SecurityGroupIds": ["sg-0ccc"]}
    model_trainer(spec(vpc=vpc), boto_session=session).train(wait=False, logs=False)
    assert fake.job()["VpcConfig"] == vpc


@pytest.mark.slow
def test_heterogeneous_job_from_the_sdk(aws):
    fake, session = aws
    model_trainer(spec(), boto_session=session).train(wait=False, logs=False)
    req = fake.job()
    assert botocore_errors(req) == []
    check_request(req)
    res = req["ResourceConfig"]
    assert "InstanceType" not in res and "InstanceCount" not in res
    assert res["InstanceGroups"] == [{"InstanceType": "ml.c5.9xlarge", "InstanceCount": 2, "InstanceGroupName": "data_group"},
                                     {"InstanceType": "ml.p3.2xlarge", "InstanceCount": 1, "InstanceGroupName": "dnn_group"}]
    channels = {c["ChannelName"]: c for c in req["InputDataConfig"]}
    groups = {name: c["DataSource"]["S3DataSource"].get("InstanceGroupNames") for name, c in channels.items()}
    assert groups == {"train": ["data_group"], "test": ["data_group", "dnn_group"],
                      "code": ["data_group", "dnn_group"], "sm_drivers": ["data_group", "dnn_group"]}
    assert channels["train"]["InputMode"] == "FastFile" and channels["test"].get("InputMode", "File") == "File"
    algo = req["AlgorithmSpecification"]
    assert algo["MetricDefinitions"] == [dict(d) for d in METRIC_DEFINITIONS if not d["Name"].startswith("autoscale:")]
    assert algo["TrainingImage"] == IMAGE and algo["ContainerEntrypoint"] == ["/bin/bash"]
    assert "sm_drivers/sm_train.sh" in " ".join(algo["ContainerArguments"])  # the SDK's driver runs the launcher
    # pipeline.X keys folded into pipeline_options: the SDK's driver exports SM_HP_<KEY> in a shell
    assert req["HyperParameters"] == {"data_group": "data_group", "dnn_group": "dnn_group", "epochs": "2",
                                      "tensorboard": "true", "pipeline_options": '{"blur_kernel":3,"batch_size":16}'}
    assert req["Environment"] == {"HETERO_JOB_SECRET": "feedface" * 4}
    assert req["EnableManagedSpotTraining"] is True and req["StoppingCondition"]["MaxWaitTimeInSeconds"] == 90000
    assert req["CheckpointConfig"]["S3Uri"] == "s3://bkt/out/nb/checkpoints"
    assert req["TensorBoardOutputConfig"] == {"S3OutputPath": "s3://bkt/out/nb/tensorboard",
                                              "LocalPath": "/opt/ml/output/data/tensorboard"}
    assert req["TrainingJobName"].startswith("nb-") and {"Key": "team", "Value": "ml"} in req["Tags"]
    assert "VpcConfig" not in req
    # the code went next to the job's output, file by file, with the entry point and requirements
    code = f"s3://bkt/out/nb/{req['TrainingJobName']}/input/code/"
    assert channels["code"]["DataSource"]["S3DataSource"]["S3Uri"].rstrip("/") + "/" == code
    files = {u[len(code):] for u in fake.uploads() if u.startswith(code)}
    assert {"launcher/entry.py", "requirements.txt", "data_service/server/data_server.py"} <= files
    assert not any(".venv" in f or "__pycache__" in f or f.startswith("tests/") for f in files)


@pytest.mark.slow
def test_homogeneous_job_and_the_secret_arn(aws):
    fake, session = aws
    hom = spec(groups=[Group("homogeneousCluster", "ml.p3.2xlarge", 2)], homogeneous=True,
               channels=[Channel("train", "s3://bkt/images")], job_secret_arn=ARN, spot=False,
               hyperparameters={"epochs": "1"})
    model_trainer(hom, boto_session=session).train(wait=False, logs=False)
    req = fake.job()
    check_request(req)
    assert req["ResourceConfig"]["InstanceType"] == "ml.p3.2xlarge" and req["ResourceConfig"]["InstanceCount"] == 2
    assert "InstanceGroups" not in req["ResourceConfig"]
    assert all("InstanceGroupNames" not in c["DataSource"]["S3DataSource"] for c in req["InputDataConfig"])
    assert req["Environment"] == {"HETERO_JOB_SECRET_ARN": ARN}
    assert hom.job_secret not in str(fake.calls)  # the random default secret is sent nowhere
    assert "TensorBoardOutputConfig" not in req and "data_group" not in req["HyperParameters"]


@pytest.mark.parametrize("changes, message", [
    ({"channels": [Channel("train", "s3://bkt/a", ("data_group",)), Channel("val", "s3://bkt/v")]},
     "SageMaker takes all or none"),
    ({"channels": [Channel("train", "s3://bkt/a", ("gpu_group",))]}, "unknown instance group 'gpu_group'"),
    ({"hyperparameters": {"pipeline": "_file_mode_pipeline:build_pipeline"}},
     "channel 'train' uses FastFile mode, but pipeline _file_mode_pipeline:build_pipeline reads only File"),
])
def test_bad_jobs_fail_before_any_call(aws, changes, message):
    fake, session = aws
    with pytest.raises(SubmitError, match=message):
        model_trainer(spec(**changes), boto_session=session)
    assert fake.calls == []


def test_hyperparameters_are_made_shell_safe_as_the_launcher_reads_them():
    from hetero.sagemaker.sdk import sdk_hyperparameters
    from launcher.config import LaunchConfig
    from launcher.job.sm_env import decode_hyperparameters

    hps = {"epochs": "2", "pipeline.size": "400", "pipeline.shape": "[1, 28, 28]", "model.width": "8",
           "pipeline.name": "a b"}
    out = sdk_hyperparameters(hps)
    assert set(out) == {"epochs", "pipeline_options", "model_options"}
    cfg = LaunchConfig.from_hyperparameters(decode_hyperparameters(out))
    assert cfg.data.pipeline_options == {"size": 400, "shape": [1, 28, 28], "name": "a b"} and cfg.model.model_options == {"width": 8}
    assert cfg == LaunchConfig.from_hyperparameters(decode_hyperparameters(hps))  # the same job either way
    with pytest.raises(SubmitError, match="'lr-decay' cannot pass through"):
        sdk_hyperparameters({"lr-decay": "1"})


@pytest.mark.parametrize("version, message", [("2.257.7", "v2 and v3 cannot be installed together"),
                                              ("3.17.0", "older than 3.18")])
def test_unusable_sdk_versions_are_named(aws, monkeypatch, version, message):
    fake, session = aws
    monkeypatch.setattr(sdk_version, "installed_version", lambda: version)
    with pytest.raises(SubmitError, match=message) as info:
        model_trainer(spec(), boto_session=session)
    assert version in str(info.value) and "pip install 'sagemaker>=3.18,<4'" in str(info.value)
    assert fake.calls == []


def _namespaces_work() -> bool:
    import shutil
    import subprocess

    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /opt && mkdir /opt/ml"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.slow
def test_two_nodes_run_the_sdks_own_sm_train_sh_with_a_real_opt_ml(aws, tmp_path):
    """End to end as SageMaker runs a ModelTrainer job, minus the container image: each node gets
    its own real /opt/ml (a private mount namespace), holding the config files SageMaker writes and
    the code and sm_drivers channels exactly as the SDK staged them for upload; the request's own
    ContainerEntrypoint + ContainerArguments run sm_train.sh, which runs the SDK's environment.py
    and basic_script_driver.py, which run the launcher."""
    import json
    import shutil
    import subprocess
    import sys

    from _launcher_helpers import SYNTHETIC_HPS, synth_data, wait_for_nodes
    from hetero.local.tree import build_nodes, free_port

    if not _namespaces_work():
        pytest.skip("needs root and unshare/mount to give each node its own /opt/ml")
    fake, session = aws
    hps = {**SYNTHETIC_HPS, "loader_workers": 0, "emulate_step_s": 0.01, "evaluate": "", "log_every": 10,
           "bind_host": "127.0.0.1", "master_port": free_port()}
    job = spec(channels=[Channel("train", "s3://bkt/data", ("data_group",))], spot=False,
               groups=[Group("data_group", "ml.c5.9xlarge", 1, "data"), Group("dnn_group", "ml.p3.2xlarge", 1, "dnn")],
               hyperparameters={k: v if isinstance(v, str) else json.dumps(v) for k, v in hps.items()})
    trainer = model_trainer(job, boto_session=session)
    args = trainer._create_training_job_args()   # what train() sends; keeps the staged folders
    algo = args["algorithm_specification"]
    command = list(algo.container_entrypoint) + list(algo.container_arguments)
    drivers = trainer._temp_code_dir.name
    code = trainer.source_code.source_dir

    nodes = build_nodes(tmp_path / "nodes", 1, 1, False, synth_data(tmp_path / "data", 64, 0), {}, "sdk-e2e")
    procs = {}
    for node in nodes:
        config = node.root / "input" / "config"
        (config / "hyperparameters.json").write_text(json.dumps(args["hyper_parameters"]))
        (config / "inputdataconfig.json").write_text(json.dumps(
            {c.channel_name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}
             for c in args["input_data_config"]}))
        shutil.copytree(code, node.root / "input" / "data" / "code")
        shutil.copytree(drivers, node.root / "input" / "data" / "sm_drivers")
        env = {**args["environment"], "TRAINING_JOB_NAME": "sdk-e2e", "HOME": str(tmp_path),
               "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "PYTHONUNBUFFERED": "1",
               "HETERO_HOST_MAP": node.env["HETERO_HOST_MAP"]}  # stands in for the cluster's DNS
        inner = f"mount -t tmpfs tmpfs /opt && mkdir /opt/ml && mount --bind {node.root} /opt/ml && exec \"$@\""
        log = open(tmp_path / f"{node.host}.log", "w")
        procs[node.host] = (subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner,
                                              "sh", *command], env=env, cwd=tmp_path, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True), log)
    logs = wait_for_nodes(procs, tmp_path, 240)
    assert {h: p.returncode for h, (p, _) in procs.items()} == {n.host: 0 for n in nodes}, logs
    dnn = next(n for n in nodes if n.role == "dnn")
    for text in logs.values():
        assert "Running Basic Script driver" in text and "Training Container Execution Completed" in text
        assert "SM_CURRENT_INSTANCE_GROUP" not in text
    metrics = json.loads((dnn.output_dir / "metrics.json").read_text())
    assert metrics["mode"] == "heterogeneous" and metrics["steps"] == 50
    assert trainer._temp_code_dir is not None
    trainer._temp_code_dir.cleanup()
