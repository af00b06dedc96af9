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
from launcher.autoscale.sagemaker_actuator import TEMPLATE_KEY, SageMakerActuator, request_for

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


def test_hetero_autoscale_act_adds_and_stops_data_only_jobs_from_the_jobs_advice_lines(monkeypatch):
    """The autoscaler outside the job: CloudWatch advice lines in (only the newest on its first read),
    data-only jobs started and the newest stopped to drain, state beside the S3 registry."""
    import argparse

    from moto import mock_aws

    from hetero.commands.autoscale import act
    from hetero.sagemaker.data_job_template import join_template
    from launcher.advice.model import LiveFigures, ServerFigures, advise
    from launcher.metric_lines import advice_line

    def line(step, wait, servers, prices={"ml.c5.9xlarge": 2.0}):
        figures = LiveFigures(0.04, wait, 1, tuple(servers), 1000, "ml.c5.9xlarge")
        return {"timestamp": 1, "message": "2026-11-26 10:00:00,000 trainer@algo-1 rank 0 INFO launcher.advice.advisor: "
                + advice_line(step, advise(figures, prices).to_dict())}

    starved = [ServerFigures("d1:6000", 25.0, 1.0)]                        # +4 nodes
    idle = [ServerFigures(f"d{i}:6000", 25.0, 0.1) for i in range(5)]     # all four joined: 4 could go
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("HETERO_JOB_SECRET", SECRET)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bkt")
        sm = boto3.client("sagemaker", region_name="us-east-1")
        logs = boto3.client("logs", region_name="us-east-1")
        clients = argparse.Namespace(sagemaker=sm, logs=logs)
        job = running_job()
        template = join_template(job, region="us-east-1")
        stream = {"logStreams": [{"logStreamName": f"{RUNNING}/algo-1-1795000000"}]}
        with Stubber(sm) as sms, Stubber(logs) as lgs:
            lgs.add_response("describe_log_streams", stream)
            lgs.add_response("get_log_events", {"events": [line(100, 0.035, starved), line(200, 0.03, starved)],
                                                "nextForwardToken": "f/1"})
            lgs.add_response("get_log_events", {"events": [], "nextForwardToken": "f/1"})
            for i in range(4):
                sms.add_response("create_training_job", {"TrainingJobArn": f"arn:aws:sagemaker:us-east-1:1:tj/{i}"})
            sms.add_response("describe_training_job", job, expected_params={"TrainingJobName": RUNNING})
            lgs.add_response("describe_log_streams", stream)
            lgs.add_response("get_log_events", {"events": [line(300, 0.0, idle)], "nextForwardToken": "f/2"})
            lgs.add_response("get_log_events", {"events": [], "nextForwardToken": "f/2"})
            for _ in range(4):
                sms.add_response("stop_training_job", {})
            sms.add_response("describe_training_job", dict(job, TrainingJobStatus="Completed"),
                             expected_params={"TrainingJobName": RUNNING})
            args = argparse.Namespace(job=RUNNING, min=1, max=8, usd_per_hour=0.0, cooldown_s=0.0, in_after=1,
                                      poll_s=1.0)
            assert act(args, clients, job, template, sleep=lambda s: None) == 0
            sms.assert_no_pending_responses()
            lgs.assert_no_pending_responses()
        state = json.loads(boto3.client("s3", region_name="us-east-1").get_object(
            Bucket="bkt", Key=f"out/{RUNNING}/registry/autoscale/state.json")["Body"].read())
    assert [(h["step"], h["action"], h["count"]) for h in state["history"]] == [(200, "out", 4), (300, "in", 4)]
    assert len(state["started"]) == 4 and state["drained"] == state["started"][::-1]  # the newest first


def test_data_only_job_names_differ_across_days_restarts_and_fit_sagemakers_rule():
    import re

    from launcher.autoscale.sagemaker_actuator import job_name

    rule = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
    day = 1795000000.0
    same_time = {job_name({"HyperParameters": {"job_name": RUNNING}}, 0, day) for _ in range(50)}  # restarts
    assert len(same_time) == 50
    a, b = (job_name({"HyperParameters": {"job_name": RUNNING}}, 0, t, tag="abc") for t in (day, day + 86400))
    assert a != b  # the same time of day on the next day
    for base in (RUNNING, "x" * 80, "a_b--", "-", ""):
        for index in (0, 7, 123):
            name = job_name({"HyperParameters": {"job_name": base}}, index)
            assert rule.match(name) and len(name) <= 63, name


def test_a_create_that_fails_part_way_returns_the_jobs_already_created(sagemaker, capsys, tmp_path,  # noqa: F811
                                                                       monkeypatch):
    from launcher.autoscale.actuators import PartialScaleOut

    template = template_of(sagemaker, capsys)
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    monkeypatch.setenv("HETERO_JOB_SECRET", SECRET)
    actuator = SageMakerActuator(str(tmp_path), client, template=template)
    with Stubber(client) as stub:
        stub.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/j0"})
        stub.add_client_error("create_training_job", "ResourceLimitExceeded", "account quota")
        with pytest.raises(PartialScaleOut, match="started 1 of 3") as failed:
            actuator.scale_out(3, ScaleContext(str(tmp_path), 1, 4))
        stub.add_response("stop_training_job", {})
        assert actuator.drain(1, ScaleContext(str(tmp_path), 2, 1)) == failed.value.created
    assert len(failed.value.created) == 1 and failed.value.created[0].startswith(f"{RUNNING}-as-")


def test_act_with_min_above_max_writes_no_template(sagemaker, capsys, monkeypatch):  # noqa: F811
    import hetero.sagemaker.data_job_template as data_job_template

    written = []
    monkeypatch.setattr(data_job_template, "write_template", lambda job, template: written.append(job) or "s3://x")
    sagemaker.add_response("describe_training_job", running_job(), expected_params={"TrainingJobName": RUNNING})
    code = main(["autoscale", RUNNING, "--region", "us-east-1", "--act", "--min", "3", "--max", "2"])
    assert code == 2 and written == []
    assert "--max 2 must be >= --min 3" in capsys.readouterr().err
    sagemaker.add_response("describe_training_job", running_job(), expected_params={"TrainingJobName": RUNNING})
    assert main(["autoscale", RUNNING, "--region", "us-east-1", "--act", "--poll-s", "inf"]) == 2 and written == []
    assert "--poll-s inf must be a finite number of seconds" in capsys.readouterr().err


def test_the_template_of_an_acting_job_carries_no_autoscale_settings():
    from hetero.sagemaker.data_job_template import join_template
    from launcher.config import LaunchConfig

    job = running_job()
    job["HyperParameters"] = dict(job["HyperParameters"], **{"autoscale.mode": "act", "autoscale.actuator": "sagemaker",
                                                             "autoscale.max": "8"})
    template = join_template(job, region="us-east-1")
    hps = {k: v for k, v in template["HyperParameters"].items() if not k.startswith("sagemaker_")}
    assert not [k for k in hps if k.startswith("autoscale.")]
    assert "autoscale:" not in json.dumps(template["AlgorithmSpecification"]["MetricDefinitions"])
    LaunchConfig.from_hyperparameters({k: v for k, v in hps.items() if k in ("join", "autoscale.mode")})
