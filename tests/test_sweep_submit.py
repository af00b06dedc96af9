"""hetero sweep: one data-only job and N DNN-only jobs, each with its own hyperparameters, one token.

AWS is a ``botocore.stub.Stubber`` on a real SageMaker client: it checks every call's parameters
against botocore's service model (and against the requests the dry run prints).
"""
from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from hetero.cli import main
from hetero.sagemaker import client as sm_client
from hetero.sagemaker.validate import botocore_errors, check_request

from test_submit import ROLE, SECRET, assert_api_rules

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/hetero:1"
SWEEP = ["sweep", "--job-name", "lr-sweep", "--role", ROLE, "--output", "s3://bkt/out", "--image", IMAGE,
         "--region", "us-east-1", "--data-group", "ml.c5.9xlarge:1", "--dnn-group", "ml.g5.xlarge:1",
         "--subnet", "subnet-0aaa", "--security-group", "sg-0bbb", "--input", "s3://bkt/train", "--no-source",
         "--hyperparameters", "pipeline=data_service.pipelines.images:build_pipeline", "pipeline.batch_size=64",
         "seed=1", "epochs=3"]


def dry_run(argv: list[str], capsys) -> list[dict]:
    assert main(SWEEP + argv + ["--dry-run"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_dry_run_shows_a_data_job_and_one_dnn_job_per_value_sharing_one_token(capsys):
    reqs = dry_run(["--vary", "lr=0.1,0.01", "--vary", "momentum=0.9,0.99", "--batch-window", "8GB",
                    "--idle-timeout", "300"], capsys)
    assert [r["TrainingJobName"] for r in reqs] == ["lr-sweep-data"] + [f"lr-sweep-{k}" for k in range(4)]
    for req in reqs:
        assert botocore_errors(req) == [] and check_request(req) is None
        assert_api_rules(req)
        assert req["HyperParameters"]["job_name"] == "lr-sweep"  # every node derives the sweep's token
        assert req["VpcConfig"] == {"Subnets": ["subnet-0aaa"], "SecurityGroupIds": ["sg-0bbb"]}
        assert req["Environment"] == {"HETERO_JOB_SECRET": "****"}
    data, *dnn = reqs
    hps = data["HyperParameters"]
    assert (hps["join"], hps["batch_window"], hps["watchdog_idle_s"]) == ("s3://bkt/out/lr-sweep/registry", "8000000000", "300")
    assert data["ResourceConfig"]["InstanceGroups"] == [
        {"InstanceType": "ml.c5.9xlarge", "InstanceCount": 1, "InstanceGroupName": "data_group"}]
    assert [c["ChannelName"] for c in data["InputDataConfig"]] == ["train"]
    assert {(r["HyperParameters"]["lr"], r["HyperParameters"]["momentum"]) for r in dnn} == {
        ("0.1", "0.9"), ("0.1", "0.99"), ("0.01", "0.9"), ("0.01", "0.99")}
    for r in dnn:
        h = r["HyperParameters"]
        assert h["registry"] == "s3://bkt/out/lr-sweep/registry" and "join" not in h and h["dnn_group"] == "dnn_group"
        assert h["pipeline.batch_size"] == "64" and h["seed"] == "1"  # one pipeline, one seed: batches shared
        assert "InputDataConfig" not in r
        assert r["ResourceConfig"]["InstanceGroups"] == [
            {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "InstanceGroupName": "dnn_group"}]


def test_the_sweep_is_submitted_data_job_first_each_request_checked_by_the_stubber(monkeypatch, capsys):
    reqs = dry_run(["--job", "lr=0.1", "--job", "lr=0.01,seed=2", "--job-secret", SECRET], capsys)
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")

    def only_sagemaker(self, service):
        assert service == "sagemaker", f"unexpected AWS call ({service})"
        return client
    monkeypatch.setattr(sm_client.Clients, "_client", only_sagemaker)
    with Stubber(client) as stub:
        for req in reqs:
            req["Environment"]["HETERO_JOB_SECRET"] = SECRET  # one secret for all of them
            arn = f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{req['TrainingJobName']}"
            stub.add_response("create_training_job", {"TrainingJobArn": arn}, expected_params=req)
        assert main(SWEEP + ["--job", "lr=0.1", "--job", "lr=0.01,seed=2", "--job-secret", SECRET]) == 0
        stub.assert_no_pending_responses()
    out = capsys.readouterr()
    assert out.out.splitlines()[0].startswith("submitted lr-sweep-data: arn:")
    assert "different seeds" in out.err and SECRET not in out.out + out.err


@pytest.mark.parametrize("argv, message", [
    (["--vary", "pipeline.batch_size=32,64"], "change the pipeline"),
    (["--vary", "lr"], "must look like KEY=V1,V2"),
    (["--job", "lr=0.1", "--jobs", "2"], "give the jobs one way"),
    (["--jobs", "2", "--batch-window", "lots"], "--batch-window: batch_window='lots'"),
    (["--jobs", "2", "--idle-timeout", "0"], "--idle-timeout 0 must be > 0"),
    (["--jobs", "101"], "give 1 to 100"),
    ([], "how many jobs?"),
])
def test_bad_sweeps_are_refused_before_any_call_naming_the_fix(argv, message, capsys):
    assert main(SWEEP + argv + ["--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_a_sweep_outside_a_vpc_is_refused(capsys):
    no_vpc = [a for a in SWEEP if a not in ("--subnet", "subnet-0aaa", "--security-group", "sg-0bbb")]
    assert main(no_vpc + ["--jobs", "2", "--dry-run"]) == 2  # the jobs' ranks could not reach the data job's nodes
    assert "a sweep runs in a VPC" in capsys.readouterr().err


def test_the_data_job_gets_the_cpu_image_of_the_framework_version_and_the_dnn_jobs_the_gpu_one(capsys):
    from hetero.sagemaker.sdk_version import sdk_problem

    if sdk_problem() is not None:
        pytest.skip(f"the image flavours come from the SageMaker SDK: {sdk_problem()}")
    argv = [a for a in SWEEP if a not in ("--image", IMAGE)] + ["--framework-version", "2.5", "--jobs", "2"]
    assert main(argv + ["--dry-run"]) == 0
    out = capsys.readouterr()
    data, *dnn = json.loads(out.out)
    for req in (data, *dnn):
        assert botocore_errors(req) == [] and check_request(req) is None
    assert "-cpu-" in data["AlgorithmSpecification"]["TrainingImage"]  # its nodes are ml.c5.9xlarge
    assert all("-gpu-" in r["AlgorithmSpecification"]["TrainingImage"] for r in dnn)
    lines = out.err.splitlines()
    assert all(line.startswith("hetero sweep: ") for line in lines), out.err
    assert any(line.startswith("hetero sweep: data job: training image ") and "-cpu-" in line for line in lines)
