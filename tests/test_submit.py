"""hetero submit: request building, validation (botocore model + API rules), dry run, moto end to end."""
from __future__ import annotations

import io
import json
import socket
import tarfile
import time

import boto3
import pytest
from botocore.stub import Stubber
from botocore.validate import ParamValidator

from hetero.cli import main
from hetero.sagemaker import client as sm_client
from hetero.sagemaker.follow import WaitTimeout, wait
from launcher.metric_lines import JobMetrics
from hetero.sagemaker.request import build_request, framework_image, masked
from hetero.sagemaker.source import build_sourcedir, split_s3
from hetero.sagemaker.spec import SubmitError, parse_input
from hetero.sagemaker.validate import botocore_errors, check_request, input_shape

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
BASE = ["submit", "--role", ROLE, "--output", "s3://bkt/out", "--image", "123456789012.dkr.ecr.us-east-1.amazonaws.com/hetero:1",
        "--region", "us-east-1"]
HET = ["--data-group", "ml.c5.9xlarge:1", "--dnn-group", "ml.p3.2xlarge:1"]
SECRET = "feedfacecafebeef0123456789abcdef"


def requests_for(argv: list[str]) -> list[dict]:
    """What `hetero submit ARGV` would send (parsed with the real parser, no AWS)."""
    from hetero.cli import build_parser
    from hetero.sagemaker.jobs import SubmitOptions, submit_specs

    return [build_request(s) for s in submit_specs(SubmitOptions.of(build_parser().parse_args(BASE + argv)))]


def assert_api_rules(req: dict) -> None:
    """The rules botocore's validator does not check, asserted independently of validate.py."""
    assert ParamValidator().validate(req, input_shape()).has_errors() is False
    res = req["ResourceConfig"]
    groups = res.get("InstanceGroups")
    if groups is not None:
        assert "InstanceType" not in res and "InstanceCount" not in res
        names = [g["InstanceGroupName"] for g in groups]
        assert 1 <= len(groups) <= 5 and len(set(names)) == len(names)
        assert all(1 <= len(n) <= 64 for n in names) and all(g["InstanceCount"] >= 1 for g in groups)
    for ch in req.get("InputDataConfig", []):
        restricted = ch["DataSource"]["S3DataSource"].get("InstanceGroupNames")
        if restricted is not None:
            assert groups and set(restricted) <= set(names) and len(restricted) <= 5


@pytest.fixture(autouse=True)
def no_aws(monkeypatch):
    """Any boto3 client made without the test asking for one fails the test."""
    def refuse(self, service):
        raise AssertionError(f"unexpected AWS call ({service})")
    monkeypatch.setattr(sm_client.Clients, "_client", refuse)
    for var in ("AWS_PROFILE", "HETERO_SAGEMAKER_ROLE", "HETERO_PRICES"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("argv", [
    HET,
    HET + ["--input", "s3://bkt/mnist@data_group", "--input", "val=s3://bkt/val@data_group+dnn_group",
           "--hyperparameters", "epochs=2", "lr=0.1"],
    HET + ["--group", "aug=ml.c5.4xlarge:2", "--group", "aux=ml.c5.xlarge:1", "--group", "dnn:x=ml.g5.xlarge:1",
           "--input", "s3://bkt/d@data_group+aug"],
    HET + ["--spot", "--max-run", "2h", "--max-wait", "3h", "--checkpoint", "s3://bkt/ck"],
    HET + ["--pair", "--input", "s3://bkt/mnist@data_group", "--spot"],
    HET + ["--pair", "--instance", "ml.g5.2xlarge:2", "--env", "A=1", "--tag", "team=ml", "--no-source"],
    ["--instance", "ml.p3.2xlarge:1", "--input", "s3://bkt/mnist", "--max-run", "90m"],
    ["--group", "g1=ml.c5.xlarge:1", "--framework-version", "2.5", "--image", ""],
])
def test_every_request_passes_botocore_and_api_rules(argv):
    reqs = requests_for(argv)
    for req in reqs:
        assert botocore_errors(req) == []
        check_request(req)
        assert_api_rules(req)
        hps = req["HyperParameters"]
        assert hps["sagemaker_program"] == "launcher/entry.py" and len(req["Environment"]["HETERO_JOB_SECRET"]) == 32
        assert "job_secret" not in hps
        if "--no-source" not in argv:
            assert hps["sagemaker_submit_directory"].endswith("/source/sourcedir.tar.gz")


def test_pair_is_same_code_and_hyperparameters_on_one_type():
    het, hom = requests_for(HET + ["--pair", "--job-name", "bench", "--input", "s3://bkt/mnist@data_group",
                                   "--hyperparameters", "epochs=3"])
    assert (het["TrainingJobName"], hom["TrainingJobName"]) == ("bench-het", "bench-hom")
    assert hom["ResourceConfig"] == {"InstanceType": "ml.p3.2xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30}
    assert "InstanceGroupNames" not in hom["InputDataConfig"][0]["DataSource"]["S3DataSource"]
    same = ("sagemaker_submit_directory", "sagemaker_program", "epochs")
    assert all(het["HyperParameters"][k] == hom["HyperParameters"][k] for k in same)
    assert het["Environment"]["HETERO_JOB_SECRET"] != hom["Environment"]["HETERO_JOB_SECRET"]
    assert (het["HyperParameters"]["data_group"], het["HyperParameters"]["dnn_group"]) == ("data_group", "dnn_group")
    assert "data_group" not in hom["HyperParameters"] and "dnn_group" not in hom["HyperParameters"]
    assert het["AlgorithmSpecification"] == hom["AlgorithmSpecification"]


def test_stubber_accepts_the_call(monkeypatch):
    """botocore.stub.Stubber validates the real create_training_job call against the model."""
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    (req,) = requests_for(HET + ["--no-source", "--job-name", "stubbed"])
    monkeypatch.setattr(sm_client.Clients, "_client", lambda self, service: client)
    spec_argv = BASE + HET + ["--no-source", "--job-name", "stubbed", "--job-secret", SECRET]
    req["Environment"]["HETERO_JOB_SECRET"] = SECRET
    with Stubber(client) as stub:
        stub.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/stubbed"},
                          expected_params=req)
        assert main(spec_argv) == 0
        stub.assert_no_pending_responses()


def test_dry_run_prints_the_full_request_with_the_secret_masked(capsys):
    assert main(BASE + HET + ["--job-name", "dry", "--job-secret", SECRET, "--input", "s3://bkt/m@data_group",
                              "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    req = json.loads(out)
    assert req["Environment"]["HETERO_JOB_SECRET"] == "****"
    assert req["ResourceConfig"]["InstanceGroups"][0] == {"InstanceType": "ml.c5.9xlarge", "InstanceCount": 1,
                                                           "InstanceGroupName": "data_group"}
    assert req["InputDataConfig"][0]["DataSource"]["S3DataSource"]["InstanceGroupNames"] == ["data_group"]
    assert botocore_errors(req) == []
    assert main(BASE + HET + ["--pair", "--dry-run", "--hyperparameters", f"job_secret={SECRET}"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out and [r["TrainingJobName"][-4:] for r in json.loads(out)] == ["-het", "-hom"]


@pytest.mark.parametrize("argv, message", [
    (HET + ["--input", "s3://bkt/d@gpu_group"], "unknown instance group 'gpu_group'"),
    (HET + ["--input", "s3://bkt/d@data_group", "--input", "v=s3://bkt/v"], "SageMaker takes all or none"),
    (["--data-group", "ml.c5.9xlarge:0", "--dnn-group", "ml.p3.2xlarge:1"], "at least 1 instance"),
    (["--instance", "ml.p3.2xlarge:0"], "at least 1 instance"),
    (HET + ["--group", "a=ml.c5.xlarge:1", "--group", "b=ml.c5.xlarge:1", "--group", "c=ml.c5.xlarge:1",
            "--group", "d=ml.c5.xlarge:1"], "6 instance groups"),
    (HET + ["--group", "dnn_group=ml.c5.xlarge:1"], "duplicate group name"),
    (HET + ["--group", "g" * 65 + "=ml.c5.xlarge:1"], "1-64 characters"),
    (["--data-group", "ml.c5.9xlargee:1", "--dnn-group", "ml.p3.2xlarge:1"], "did you mean ml.c5.9xlarge"),
    (["--data-group", "c5.9xlarge:1"], "start with 'ml.'"),
    (["--data-group", "ml.c5.9xlarge"], "TYPE:COUNT"),
    (HET + ["--input", "bkt/data"], "S3 URI"),
    (HET + ["--input", "s3://bkt/a", "--input", "s3://bkt/b"], "appears twice"),
    (HET + ["--max-wait", "3h"], "--spot"),
    (HET + ["--spot", "--max-run", "4h", "--max-wait", "1h"], "shorter than max run"),
    (HET + ["--max-run", "30d"], "28 days"),
    (HET + ["--max-run", "soon"], "positive duration"),
    (["--instance", "ml.p3.2xlarge:1", "--input", "s3://bkt/d@data_group"], "homogeneous job has no instance groups"),
    (HET + ["--instance", "ml.p3.2xlarge:1"], "--pair"),
    (["--instance", "ml.p3.2xlarge:1", "--pair"], "--pair needs"),
    ([], "no cluster"),
    (HET + ["--job-name", "bad_name"], "job name 'bad_name'"),
    (HET + ["--hyperparameters", "novalue"], "key=value"),
    (HET + ["--framework-version", "1.0", "--image", ""], "--framework-version '1.0'"),
])
def test_bad_input_fails_before_any_aws_call(argv, message, capsys):
    assert main(BASE + argv) == 2  # without --dry-run: the no_aws fixture proves no client was made
    assert message in capsys.readouterr().err


def test_missing_role_output_image_and_region(capsys, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    cases = [(["submit", "--output", "s3://bkt/o", "--image", "i", "--region", "us-east-1"], "missing role"),
             (["submit", "--role", ROLE, "--image", "i", "--region", "us-east-1"], "--output None"),
             (["submit", "--role", ROLE, "--output", "s3://bkt/o", "--region", "us-east-1"], "no training image"),
             (["submit", "--role", "admin", "--output", "s3://bkt/o", "--image", "i", "--region", "us-east-1"],
              "not an IAM role ARN"),
             (["submit", "--role", ROLE, "--output", "s3://bkt/o", "--image", "i"], "no AWS region")]
    for argv, message in cases:
        assert main(argv + HET) == 2, argv
        assert message in capsys.readouterr().err


def test_own_checks_catch_what_botocore_does_not():
    (good,) = requests_for(HET + ["--input", "s3://bkt/d@data_group"])
    groups = good["ResourceConfig"]["InstanceGroups"]
    broken = {
        "InstanceType beside InstanceGroups": {"ResourceConfig": {**good["ResourceConfig"], "InstanceType": "ml.p3.2xlarge",
                                                                  "InstanceCount": 1}},
        "6 instance groups": {"ResourceConfig": {"InstanceGroups": [dict(groups[0], InstanceGroupName=f"g{i}")
                                                                    for i in range(6)], "VolumeSizeInGB": 30}},
        "1-64 characters": {"ResourceConfig": {"InstanceGroups": [dict(groups[0], InstanceGroupName="n" * 65)],
                                               "VolumeSizeInGB": 30}},
        "duplicate group name": {"ResourceConfig": {"InstanceGroups": [groups[0], groups[0]], "VolumeSizeInGB": 30}},
        "unknown instance type": {"ResourceConfig": {"InstanceGroups": [dict(groups[0], InstanceType="ml.z9.huge")],
                                                     "VolumeSizeInGB": 30}},
        "unknown instance group 'zzz'": {"ResourceConfig": {"InstanceGroups": [dict(groups[0], InstanceGroupName="x"),
                                                                                     groups[1]], "VolumeSizeInGB": 30},
                                               "InputDataConfig": [dict(good["InputDataConfig"][0], DataSource={
                                                   "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/d",
                                                                    "InstanceGroupNames": ["dnn_group", "zzz"]}})]},
    }
    for message, change in broken.items():
        req = {**good, **change}
        assert botocore_errors(req) == [], message  # botocore alone accepts it...
        with pytest.raises(SubmitError, match=message.replace("(", r"\(").split(" beside")[0]):
            check_request(req)  # ...we do not
    with pytest.raises(SubmitError, match="botocore: Missing required parameter.*RoleArn"):
        check_request({k: v for k, v in good.items() if k != "RoleArn"})


def test_parse_input_and_framework_image():
    assert parse_input("s3://b/x") == parse_input("train=s3://b/x")
    ch = parse_input("val=s3://b/p@q/x@data_group+aug")
    assert (ch.name, ch.s3_uri, ch.groups) == ("val", "s3://b/p@q/x", ("data_group", "aug"))
    assert parse_input("s3://b/user@host/k").groups == ()
    assert framework_image("2.5.1", "eu-west-1").startswith("763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-training:2.5")
    with pytest.raises(SubmitError, match="another account"):
        framework_image("2.5", "cn-north-1")


def make_checkout(tmp_path):
    root = tmp_path / "checkout"
    for rel, text in {"launcher/entry.py": "print('hi')\n", "hetero/__init__.py": "", "hetero/__pycache__/x.pyc": "",
                      "pyproject.toml": '[project]\ndependencies = ["torch>=2", "grpcio>=1.6", "numpy"]\n'}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_source_archive_is_deterministic_and_complete(tmp_path):
    root = make_checkout(tmp_path)
    data, digest = build_sourcedir(root)
    assert build_sourcedir(root) == (data, digest)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        assert tar.extractfile("requirements.txt").read().decode() == "grpcio>=1.6\nnumpy\n"
    assert "launcher/entry.py" in names and "pyproject.toml" in names and not any("__pycache__" in n for n in names)
    (root / "launcher/entry.py").unlink()
    with pytest.raises(SubmitError, match="no launcher/entry.py"):
        build_sourcedir(root)


def test_wait_has_a_deadline():
    class Fake:
        class sagemaker:
            @staticmethod
            def describe_training_job(TrainingJobName):
                return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Training"}
    now = [0.0]
    with pytest.raises(WaitTimeout, match="still running after 100 s"):
        wait(Fake, ["j"], timeout_s=100, poll_s=30, sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert now[0] == 100
    assert JobMetrics.from_json({"avg_step_time_s": 0.2}).avg_step_time_s == 0.2
    assert JobMetrics.from_json({"mean_step_time_s": 0.2}).avg_step_time_s is None  # only the name the trainer writes


def output_tar(metrics: dict) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        data = json.dumps(metrics).encode()
        info = tarfile.TarInfo("metrics.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.fixture
def moto_endpoint(monkeypatch):
    from moto.server import ThreadedMotoServer

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with socket.create_connection((host, port), timeout=5):
        pass
    yield f"http://{host}:{port}"
    server.stop()


def test_end_to_end_pair_against_moto(moto_endpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.undo()  # real clients from here on (pointed at moto)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.delenv("HETERO_PRICES", raising=False)
    kw = {"endpoint_url": moto_endpoint, "region_name": "us-east-1"}
    s3, sm, logs = boto3.client("s3", **kw), boto3.client("sagemaker", **kw), boto3.client("logs", **kw)
    s3.create_bucket(Bucket="bkt")
    s3.put_object(Bucket="bkt", Key="out/bench-het/output/output.tar.gz",
                  Body=output_tar({"avg_step_time_s": 0.18, "steps": 4800, "step_kind": "emulated"}))
    s3.put_object(Bucket="bkt", Key="out/bench-hom/output/output.tar.gz", Body=output_tar({"avg_step_time_s": 1.19}))
    logs.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName="bench-het/algo-1-1700000000")
    logs.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName="bench-het/algo-1-1700000000",
                        logEvents=[{"timestamp": int(time.time() * 1000), "message": "step 100 loss 0.5"}])

    argv = BASE + HET + ["--pair", "--job-name", "bench", "--input", "s3://bkt/mnist@data_group", "--spot",
                         "--hyperparameters", "epochs=1", "--endpoint-url", moto_endpoint, "--job-secret", SECRET, "--source-dir",
                         str(make_checkout(tmp_path)), "--wait", "--poll", "0.1", "--wait-timeout", "30"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "submitted bench-het: arn:aws:sagemaker:us-east-1:" in out and "submitted bench-hom" in out
    assert "[algo-1-1700000000] step 100 loss 0.5" in out
    assert "avg step 0.1800 s (emulated accelerator step), 0.0283 cents/step" in out and "avg step 1.1900 s, 0.1264 cents/step" in out
    assert "step time x6.61, cost per step x4.47" in out

    het = sm.describe_training_job(TrainingJobName="bench-het")
    hom = sm.describe_training_job(TrainingJobName="bench-hom")
    assert [g["InstanceGroupName"] for g in het["ResourceConfig"]["InstanceGroups"]] == ["data_group", "dnn_group"]
    assert hom["ResourceConfig"]["InstanceType"] == "ml.p3.2xlarge" and "InstanceGroups" not in hom["ResourceConfig"]
    assert het["InputDataConfig"][0]["DataSource"]["S3DataSource"]["InstanceGroupNames"] == ["data_group"]
    assert het["EnableManagedSpotTraining"] and het["CheckpointConfig"]["S3Uri"] == "s3://bkt/out/bench-het/checkpoints"
    hps = het["HyperParameters"]
    assert SECRET not in out and SECRET not in json.dumps(hps)  # moto does not keep Environment
    assert hps["data_group"] == "data_group" and hps["dnn_group"] == "dnn_group" and hps["epochs"] == "1"
    bucket, key = split_s3(hps["sagemaker_submit_directory"])
    assert hom["HyperParameters"]["sagemaker_submit_directory"] == hps["sagemaker_submit_directory"]
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert tar.extractfile("launcher/entry.py").read() == b"print('hi')\n"


def test_masked_leaves_the_request_untouched():
    (req,) = requests_for(HET)
    secret = req["Environment"]["HETERO_JOB_SECRET"]
    assert masked(req)["Environment"]["HETERO_JOB_SECRET"] == "****"
    assert req["Environment"]["HETERO_JOB_SECRET"] == secret


def test_failed_job_is_reported_without_metrics(monkeypatch):
    from hetero.sagemaker.report import follow_jobs, report_lines

    desc = {"TrainingJobName": "j", "TrainingJobStatus": "Failed", "FailureReason": "AlgorithmError: boom",
            "ResourceConfig": {"InstanceType": "ml.p3.2xlarge", "InstanceCount": 2}, "TrainingTimeInSeconds": 3600,
            "OutputDataConfig": {"S3OutputPath": "s3://b/o"}}

    class Fake:
        class sagemaker:
            @staticmethod
            def describe_training_job(TrainingJobName):
                return desc

        class s3:
            @staticmethod
            def get_object(**kw):
                raise AssertionError("metrics of a failed job are not fetched")

    (summary,) = follow_jobs(Fake, ["j"], timeout_s=5, poll_s=1)
    assert summary["status"] == "Failed" and summary["usd_on_demand"] == pytest.approx(2 * 3.825)
    lines = "\n".join(report_lines([summary]))
    assert "j: Failed on 2x ml.p3.2xlarge, no step time" in lines and "failure: AlgorithmError: boom" in lines
