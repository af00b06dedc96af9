"""hetero submit --join: a data-only job made from a running one, and the options it builds on
(--registry, --subnet/--security-group, the live advice's prices).

AWS is a ``botocore.stub.Stubber`` on a real SageMaker client: it checks every call's parameters
and every canned response against botocore's service model.
"""
from __future__ import annotations

import copy
import datetime
import json

import boto3
import pytest
from botocore.stub import Stubber

from hetero.cli import main
from hetero.sagemaker import client as sm_client
from hetero.sagemaker.validate import botocore_errors, check_request

from test_submit import BASE, HET, ROLE, SECRET, assert_api_rules, requests_for

RUNNING = "hetero-het-20261125-230000-ab12"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/hetero:1"
SOURCE = f"s3://bkt/out/{RUNNING}/source/sourcedir.tar.gz"
VPC = {"Subnets": ["subnet-0aaa", "subnet-0bbb"], "SecurityGroupIds": ["sg-0ccc"]}


def running_job(**changes) -> dict:
    """A DescribeTrainingJob response of a running heterogeneous job with a registry and a VPC."""
    job = {
        "TrainingJobName": RUNNING,
        "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{RUNNING}",
        "ModelArtifacts": {"S3ModelArtifacts": ""}, "TrainingJobStatus": "InProgress", "SecondaryStatus": "Training",
        "RoleArn": ROLE, "CreationTime": datetime.datetime(2026, 11, 25, 23, 0),
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "HyperParameters": {"sagemaker_program": "launcher/entry.py", "sagemaker_submit_directory": SOURCE,
                            "sagemaker_region": "us-east-1", "sagemaker_job_name": RUNNING,
                            "sagemaker_container_log_level": "20", "data_group": "data_group",
                            "dnn_group": "dnn_group", "epochs": "3", "pipeline.batch_size": "64",
                            "registry": f"s3://bkt/out/{RUNNING}/registry"},
        "InputDataConfig": [
            {"ChannelName": "train", "InputMode": "FastFile", "DataSource": {"S3DataSource": {
                "S3DataType": "S3Prefix", "S3Uri": "s3://bkt/images", "InstanceGroupNames": ["data_group"]}}},
            {"ChannelName": "val", "InputMode": "File", "DataSource": {"S3DataSource": {
                "S3DataType": "S3Prefix", "S3Uri": "s3://bkt/val", "InstanceGroupNames": ["dnn_group"]}}}],
        "OutputDataConfig": {"S3OutputPath": "s3://bkt/out"},
        "ResourceConfig": {"VolumeSizeInGB": 50, "InstanceGroups": [
            {"InstanceType": "ml.c5.9xlarge", "InstanceCount": 1, "InstanceGroupName": "data_group"},
            {"InstanceType": "ml.p3.2xlarge", "InstanceCount": 1, "InstanceGroupName": "dnn_group"}]},
        "VpcConfig": copy.deepcopy(VPC),
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "Environment": {"HETERO_JOB_SECRET": SECRET},
    }
    job.update(changes)
    return job


@pytest.fixture
def sagemaker(monkeypatch):
    """A real SageMaker client behind a Stubber; every other AWS client fails the test."""
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")

    def only_sagemaker(self, service):
        assert service == "sagemaker", f"unexpected AWS call ({service})"
        return client
    monkeypatch.setattr(sm_client.Clients, "_client", only_sagemaker)
    monkeypatch.delenv("HETERO_SAGEMAKER_ROLE", raising=False)
    with Stubber(client) as stub:
        yield stub
        stub.assert_no_pending_responses()


def join(stub, job, argv, capsys):
    stub.add_response("describe_training_job", job, expected_params={"TrainingJobName": RUNNING})
    code = main(["submit", "--join", RUNNING, "--region", "us-east-1"] + argv)
    return code, capsys.readouterr()


def test_dry_run_shows_a_data_only_job_that_registers_with_the_running_job(sagemaker, capsys):
    code, out = join(sagemaker, running_job(), ["--data-group", "ml.c5.4xlarge:2", "--job-name", "extra", "--dry-run"],
                     capsys)
    assert code == 0, out.err
    req = json.loads(out.out)
    assert botocore_errors(req) == [] and check_request(req) is None
    assert_api_rules(req)
    assert req["ResourceConfig"] == {"InstanceGroups": [
        {"InstanceType": "ml.c5.4xlarge", "InstanceCount": 2, "InstanceGroupName": "data_group"}], "VolumeSizeInGB": 50}
    hps = req["HyperParameters"]
    assert hps["join"] == f"s3://bkt/out/{RUNNING}/registry" and hps["job_name"] == RUNNING
    assert "registry" not in hps and "dnn_group" not in hps and hps["data_group"] == "data_group"
    assert (hps["sagemaker_job_name"], hps["sagemaker_submit_directory"]) == ("extra", SOURCE)
    assert (hps["epochs"], hps["pipeline.batch_size"]) == ("3", "64")
    assert req["AlgorithmSpecification"]["TrainingImage"] == IMAGE and req["RoleArn"] == ROLE
    assert req["VpcConfig"] == VPC
    assert [c["ChannelName"] for c in req["InputDataConfig"]] == ["train"]  # the DNN nodes' channel stays there
    assert req["InputDataConfig"][0]["InputMode"] == "FastFile"
    assert req["Environment"] == {"HETERO_JOB_SECRET": "****"} and SECRET not in out.out
    assert {t["Key"]: t["Value"] for t in req["Tags"]}["hetero:joins"] == RUNNING
    assert f"job secret: job {RUNNING}'s" in out.err


def test_a_joiner_of_an_autoscaling_job_carries_none_of_its_autoscale_settings(sagemaker, capsys):
    job = running_job()
    job["HyperParameters"].update({"autoscale.mode": "act", "autoscale.max": "6", "autoscale.actuator": "sagemaker"})
    code, out = join(sagemaker, job, ["--job-name", "extra", "--dry-run"], capsys)
    assert code == 0, out.err
    hps = json.loads(out.out)["HyperParameters"]
    # with autoscale.mode=act and no registry of its own, the joiner's launcher would refuse to start
    assert not [k for k in hps if k.startswith("autoscale.")] and hps["epochs"] == "3"


def test_the_create_call_carries_the_running_jobs_secret(sagemaker, capsys):
    sagemaker.add_response("describe_training_job", running_job(), expected_params={"TrainingJobName": RUNNING})
    # the request the dry run shows, with the real secret: what create_training_job must receive
    main(["submit", "--join", RUNNING, "--region", "us-east-1", "--job-name", "extra", "--dry-run"])
    expected = json.loads(capsys.readouterr().out)
    expected["Environment"]["HETERO_JOB_SECRET"] = SECRET
    assert expected["ResourceConfig"]["InstanceGroups"][0]["InstanceType"] == "ml.c5.9xlarge"  # the running type
    sagemaker.add_response("describe_training_job", running_job(), expected_params={"TrainingJobName": RUNNING})
    created = {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/extra"}
    sagemaker.add_response("create_training_job", created, expected_params=expected)
    assert main(["submit", "--join", RUNNING, "--region", "us-east-1", "--job-name", "extra"]) == 0
    assert "submitted extra" in capsys.readouterr().out


def test_a_secret_arn_travels_as_the_arn(sagemaker, capsys):
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hetero-job-AbCdEf"
    code, out = join(sagemaker, running_job(Environment={"HETERO_JOB_SECRET_ARN": arn, "A": "1"}), ["--dry-run"],
                     capsys)
    assert code == 0, out.err
    assert json.loads(out.out)["Environment"] == {"A": "1", "HETERO_JOB_SECRET_ARN": arn}


@pytest.mark.parametrize("changes, argv, message", [
    ({"HyperParameters": {"data_group": "data_group", "dnn_group": "dnn_group"}}, [],
     "has no 'registry' hyperparameter"),
    ({"HyperParameters": {"registry": "/opt/ml/output/registry"}}, [], "submit it with an S3 registry"),
    ({"VpcConfig": None}, [], "runs without a VpcConfig"),
    ({}, ["--subnet", "subnet-0zzz", "--security-group", "sg-0ccc"], "subnet-0zzz"),
    ({}, ["--subnet", "subnet-0aaa", "--security-group", "sg-0other"], "Omit --subnet/--security-group"),
    ({"TrainingJobStatus": "Completed"}, [], "is Completed, not InProgress"),
    ({"Environment": {}}, [], "neither HETERO_JOB_SECRET nor HETERO_JOB_SECRET_ARN"),
])
def test_a_job_that_cannot_be_joined_is_refused_with_the_fix(sagemaker, capsys, changes, argv, message):
    job = running_job(**changes)
    if changes.get("VpcConfig", 1) is None:
        del job["VpcConfig"]
    code, out = join(sagemaker, job, argv + ["--dry-run"], capsys)
    assert code == 2 and message in out.err, out.err
    assert out.out == ""


def test_vpc_mismatch_names_both_configs(sagemaker, capsys):
    code, out = join(sagemaker, running_job(), ["--subnet", "subnet-0zzz", "--security-group", "sg-0ccc", "--dry-run"],
                     capsys)
    assert code == 2
    assert "'subnet-0zzz'" in out.err and "'subnet-0aaa', 'subnet-0bbb'" in out.err


def test_join_takes_no_cluster_of_its_own_and_an_unknown_job_is_an_aws_error(sagemaker, capsys):
    assert main(["submit", "--join", RUNNING, "--region", "us-east-1", "--dnn-group", "ml.p3.2xlarge:1"]) == 2
    assert "data-only job" in capsys.readouterr().err
    sagemaker.add_client_error("describe_training_job", "ValidationException", "Requested resource not found.",
                               expected_params={"TrainingJobName": RUNNING})
    assert main(["submit", "--join", RUNNING, "--region", "us-east-1", "--dry-run"]) == 1
    assert "cannot read training job" in capsys.readouterr().err


def test_plain_submit_sets_registry_vpc_and_advice_prices():
    (req,) = requests_for(HET + ["--job-name", "reg", "--registry", "--subnet", "subnet-0aaa,subnet-0bbb",
                                 "--security-group", "sg-0ccc"])
    assert botocore_errors(req) == [] and check_request(req) is None
    assert req["HyperParameters"]["registry"] == "s3://bkt/out/reg/registry"
    assert req["VpcConfig"] == VPC
    assert json.loads(req["HyperParameters"]["advice_prices"]) == {"ml.c5.9xlarge": 1.836, "ml.p3.2xlarge": 3.825}
    (other,) = requests_for(HET + ["--registry", "s3://bkt/reg/"])
    assert other["HyperParameters"]["registry"] == "s3://bkt/reg" and "VpcConfig" not in other
    het, hom = requests_for(HET + ["--pair", "--registry", "--subnet", "subnet-0aaa", "--security-group", "sg-0ccc"])
    assert "registry" in het["HyperParameters"] and "registry" not in hom["HyperParameters"]
    assert het["VpcConfig"] == hom["VpcConfig"] == {"Subnets": ["subnet-0aaa"], "SecurityGroupIds": ["sg-0ccc"]}


@pytest.mark.parametrize("argv, message", [
    (HET + ["--subnet", "subnet-0aaa"], "both --subnet and --security-group"),
    (HET + ["--subnet", "net-1", "--security-group", "sg-1"], "subnet-0123abcd"),
    (HET + ["--registry", "bkt/reg"], "--registry 'bkt/reg' must be an S3 URI"),
])
def test_bad_vpc_or_registry_fails_before_any_aws_call(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(sm_client.Clients, "_client", lambda self, service: pytest.fail(f"AWS call ({service})"))
    assert main(BASE + argv) == 2
    assert message in capsys.readouterr().err
