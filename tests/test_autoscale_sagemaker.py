"""The SageMaker actuator: the data-only job template (hetero autoscale JOB) and the calls rank 0
makes from it. AWS is a ``botocore.stub.Stubber`` on a real SageMaker client: every call's
parameters and every canned response are checked against botocore's service model."""
from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from data_service.errors import ConfigError
from hetero.cli import main
from hetero.sagemaker.validate import botocore_errors, check_request
from launcher.autoscale.actuators import ScaleContext
from launcher.autoscale.sagemaker import TEMPLATE_KEY, SageMakerActuator, request_for

from test_submit_join import RUNNING, SECRET, running_job, sagemaker  # noqa: F401 - the fixture


def template_of(stub, capsys, *argv):
    stub.add_response("describe_training_job", running_job(), expected_params={"TrainingJobName": RUNNING})
    code = main(["autoscale", RUNNING, "--region", "us-east-1", "--dry-run", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_the_template_is_one_spot_data_node_with_a_warm_pool_and_no_secret(sagemaker, capsys):  # noqa: F811
    t = template_of(sagemaker, capsys, "--keep-alive", "900")
    assert t["ResourceConfig"]["InstanceGroups"] == [
        {"InstanceType": "ml.c5.9xlarge", "InstanceCount": 1, "InstanceGroupName": "data_group"}]
    assert t["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900
    assert t["EnableManagedSpotTraining"] is True and "{job}" in t["CheckpointConfig"]["S3Uri"]
    assert t["HyperParameters"]["join"] == f"s3://bkt/out/{RUNNING}/registry"
    assert SECRET not in json.dumps(t) and "HETERO_JOB_SECRET" not in t["Environment"]
    assert {x["Key"]: x["Value"] for x in t["Tags"]}["hetero:autoscale"] == "true"
    request = request_for(t, "x-as-1", {"HETERO_JOB_SECRET": SECRET})
    assert botocore_errors(request) == [] and check_request(request) is None
    assert request["CheckpointConfig"]["S3Uri"] == f"s3://bkt/out/x-as-1/checkpoints"


def test_on_demand_and_a_bad_keep_alive(sagemaker, capsys):  # noqa: F811
    t = template_of(sagemaker, capsys, "--on-demand", "--instance-type", "ml.c5.4xlarge")
    assert "EnableManagedSpotTraining" not in t and "KeepAlivePeriodInSeconds" not in t["ResourceConfig"]
    assert t["ResourceConfig"]["InstanceGroups"][0]["InstanceType"] == "ml.c5.4xlarge"
    sagemaker.add_response("describe_training_job", running_job(), expected_params={"TrainingJobName": RUNNING})
    assert main(["autoscale", RUNNING, "--region", "us-east-1", "--dry-run", "--keep-alive", "7200"]) == 2
    assert "--keep-alive 7200 must be 0..3600" in capsys.readouterr().err


def test_rank_0_starts_one_data_only_job_per_node_with_its_own_secret(sagemaker, capsys, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    template = template_of(sagemaker, capsys, "--keep-alive", "600")
    (tmp_path / "autoscale").mkdir()
    (tmp_path / TEMPLATE_KEY).write_text(json.dumps(template))
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    monkeypatch.setenv("HETERO_JOB_SECRET", SECRET)
    actuator = SageMakerActuator(str(tmp_path), client)
    with Stubber(client) as stub:
        for i in range(2):
            name = f"{RUNNING}-as-"
            arn = f"arn:aws:sagemaker:us-east-1:1:training-job/j{i}"
            stub.add_response("create_training_job", {"TrainingJobArn": arn})
        names = actuator.scale_out(2, ScaleContext(str(tmp_path), 1, 3))
        stub.assert_no_pending_responses()
    assert len(names) == 2 and len(set(names)) == 2 and all(n.startswith(name) and len(n) <= 63 for n in names)
    monkeypatch.delenv("HETERO_JOB_SECRET")
    with pytest.raises(ConfigError, match="neither HETERO_JOB_SECRET nor HETERO_JOB_SECRET_ARN"):
        request_for(template, "y")


def test_no_template_starts_nothing(tmp_path, caplog):
    actuator = SageMakerActuator(str(tmp_path), client=object())
    assert actuator.scale_out(1, ScaleContext(str(tmp_path), 1, 2)) == []
    assert "run `hetero autoscale JOB`" in caplog.text


def test_moto_takes_the_data_only_jobs_rank_0_starts(sagemaker, capsys, tmp_path, monkeypatch):  # noqa: F811
    from moto import mock_aws

    template = template_of(sagemaker, capsys, "--keep-alive", "300")
    (tmp_path / "autoscale").mkdir()
    (tmp_path / TEMPLATE_KEY).write_text(json.dumps(template))
    monkeypatch.setenv("HETERO_JOB_SECRET", SECRET)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    with mock_aws():
        client = boto3.client("sagemaker", region_name="us-east-1")
        names = SageMakerActuator(str(tmp_path), client).scale_out(2, ScaleContext(str(tmp_path), 1, 3))
        listed = {j["TrainingJobName"] for j in client.list_training_jobs()["TrainingJobSummaries"]}
        desc = client.describe_training_job(TrainingJobName=names[0])
    assert set(names) <= listed
    assert desc["HyperParameters"]["join"] == f"s3://bkt/out/{RUNNING}/registry"
    assert desc["ResourceConfig"]["InstanceGroups"][0]["InstanceCount"] == 1
