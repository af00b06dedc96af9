"""hetero submit: metric definitions, input modes, the job secret's two routes, TensorBoard, images."""
from __future__ import annotations

import json

import pytest

from hetero.cli import main
from hetero.sagemaker import client as sm_client
from hetero.sagemaker import images
from hetero.sagemaker.request import autoscale_acts, build_request
from hetero.sagemaker.sdk_version import sdk_problem
from hetero.sagemaker.spec import Channel, SubmitError, apply_input_modes
from hetero.sagemaker.validate import botocore_errors, check_request
from launcher.metric_lines import METRIC_DEFINITIONS

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
BASE = ["submit", "--role", ROLE, "--output", "s3://bkt/out", "--image", "123456789012.dkr.ecr.us-east-1.amazonaws.com/h:1",
        "--region", "us-east-1"]
HET = ["--data-group", "ml.c5.9xlarge:1", "--dnn-group", "ml.p3.2xlarge:1"]
ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hetero-job-AbCdEf"


@pytest.fixture(autouse=True)
def no_aws(monkeypatch):
    def refuse(self, service):
        raise AssertionError(f"unexpected AWS call ({service})")
    monkeypatch.setattr(sm_client.Clients, "_client", refuse)
    monkeypatch.delenv("HETERO_SAGEMAKER_ROLE", raising=False)


def dry_run(argv: list[str], capsys) -> tuple[list[dict], str]:
    assert main(BASE + argv + ["--dry-run"]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    return (out if isinstance(out, list) else [out]), captured.err


def test_every_job_carries_the_metric_definitions(capsys):
    reqs, _ = dry_run(HET + ["--pair"], capsys)
    hom, = dry_run(["--instance", "ml.p3.2xlarge:1"], capsys)[0]
    (acting,), _ = dry_run(HET + ["--hyperparameters", "autoscale.mode=act", "autoscale.actuator=sagemaker",
                                  "registry=s3://bkt/reg"], capsys)
    unscaled = [dict(d) for d in METRIC_DEFINITIONS if not d["Name"].startswith("autoscale:")]
    for req in reqs + [hom]:  # autoscale:* lines come only from a job whose autoscaler acts
        spec = req["AlgorithmSpecification"]
        assert spec["MetricDefinitions"] == unscaled
        assert spec["EnableSageMakerMetricsTimeSeries"] is True
        assert botocore_errors(req) == []
    assert acting["AlgorithmSpecification"]["MetricDefinitions"] == [dict(d) for d in METRIC_DEFINITIONS]
    assert botocore_errors(acting) == []
    assert autoscale_acts({"autoscale.mode": '"act"'}) and not autoscale_acts({"autoscale.mode": "advise"})
    assert not autoscale_acts({"autoscale.mode": "act", "join": "s3://bkt/reg"})  # a data-only job has no rank 0
    names = [d["Name"] for d in METRIC_DEFINITIONS]
    assert {"train:step_time_s", "train:data_wait_percent", "train:samples_per_s", "train:loss", "test:accuracy",
            "data:batches_per_s", "advice:data_node_change", "advice:predicted_step_s", "advice:change_usd_per_hour",
            "advice:change_usd_per_epoch", "autoscale:target_nodes", "autoscale:node_change",
            "autoscale:usd_per_hour"} == set(names)


def test_input_modes_per_channel(capsys):
    (req,), _ = dry_run(HET + ["--input", "img=s3://bkt/img@data_group", "--input", "val=s3://bkt/val@data_group",
                               "--input-mode", "FastFile", "--input-mode", "val=File"], capsys)
    modes = {c["ChannelName"]: c["InputMode"] for c in req["InputDataConfig"]}
    assert modes == {"img": "FastFile", "val": "File"}
    assert req["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    check_request(req)
    # the homogeneous twin keeps each channel's mode
    reqs, _ = dry_run(HET + ["--pair", "--input", "s3://bkt/img@data_group", "--input-mode", "fastfile"], capsys)
    assert [r["InputDataConfig"][0]["InputMode"] for r in reqs] == ["FastFile", "FastFile"]


@pytest.mark.parametrize("argv, message", [
    (["--input", "s3://bkt/d", "--input-mode", "Pipe"], "Pipe mode is not supported"),
    (["--input", "s3://bkt/d", "--input-mode", "Fast"], "--input-mode 'Fast': mode must be one of File, FastFile"),
    (["--input", "s3://bkt/d", "--input-mode", "images=FastFile"], "no input channel 'images'; the channels are ['train']"),
    (["--input-mode", "FastFile"], "no --input channel"),
    (["--input", "s3://bkt/d", "--input-mode", "FastFile", "--hyperparameters",
      "pipeline=_file_mode_pipeline:build_pipeline"],
     "channel 'train' uses FastFile mode, but pipeline _file_mode_pipeline:build_pipeline reads only File"),
    (["--input", "s3://bkt/d", "--input-mode", "FastFile", "--hyperparameters",
      "pipeline=_file_mode_pipeline:broken_declaration"], "declares input_modes=('Files',)"),
    (["--input", "s3://bkt/d@gpu_group"], "unknown instance group 'gpu_group'; known groups: data_group, dnn_group"),
    (["--job-secret", "s", "--job-secret-arn", ARN], "not both"),
    (["--job-secret-arn", "arn:aws:s3:::bucket/key"], "not a Secrets Manager secret ARN"),
])
def test_bad_input_names_the_value_and_the_fix(argv, message, capsys):
    assert main(BASE + HET + argv) == 2
    assert message in capsys.readouterr().err


def test_file_only_pipeline_is_fine_with_file_mode_and_unimportable_ones_are_not_blocked(capsys, caplog):
    (req,), _ = dry_run(HET + ["--input", "s3://bkt/d", "--hyperparameters",
                               "pipeline=_file_mode_pipeline:build_pipeline"], capsys)
    assert req["InputDataConfig"][0]["InputMode"] == "File"
    (req,), _ = dry_run(HET + ["--input", "s3://bkt/d", "--input-mode", "FastFile", "--hyperparameters",
                               "pipeline=only_in_the_image:build"], capsys)
    assert req["InputDataConfig"][0]["InputMode"] == "FastFile"
    assert "cannot import pipeline only_in_the_image:build here" in caplog.text


def test_apply_input_modes_later_items_win():
    chans = [Channel("a", "s3://b/a"), Channel("b", "s3://b/b")]
    out = apply_input_modes(chans, ["b=FastFile", "File", "a=FastFile"])
    assert [c.input_mode for c in out] == ["FastFile", "File"]
    with pytest.raises(SubmitError, match="mode must be one of"):
        apply_input_modes(chans, ["a="])


def test_default_secret_is_in_environment_and_the_dry_run_says_who_can_read_it(capsys):
    (req,), err = dry_run(HET, capsys)
    assert req["Environment"]["HETERO_JOB_SECRET"] == "****"
    assert "sent in clear" in err and "sagemaker:DescribeTrainingJob" in err and "--job-secret-arn" in err


def test_secret_arn_keeps_the_secret_out_of_the_request(capsys):
    from hetero.cli import build_parser
    from hetero.sagemaker.jobs import SubmitOptions, submit_specs

    specs = submit_specs(SubmitOptions.of(build_parser().parse_args(BASE + HET + ["--pair", "--job-secret-arn", ARN])))
    for spec in specs:
        req = build_request(spec)
        assert req["Environment"] == {"HETERO_JOB_SECRET_ARN": ARN}
        assert spec.job_secret not in json.dumps(req)  # the random default is never sent
        check_request(req)
    reqs, err = dry_run(HET + ["--job-secret-arn", ARN], capsys)
    assert "AWS Secrets Manager" in err and "secretsmanager:GetSecretValue" in err and "not in the request" in err


def test_tensorboard_sets_the_output_config(capsys):
    (req,), _ = dry_run(HET + ["--job-name", "tb", "--hyperparameters", "tensorboard=true"], capsys)
    assert req["TensorBoardOutputConfig"] == {"S3OutputPath": "s3://bkt/out/tb/tensorboard",
                                              "LocalPath": "/opt/ml/output/data/tensorboard"}
    assert botocore_errors(req) == []
    (req,), _ = dry_run(HET + ["--hyperparameters", "tensorboard=false"], capsys)
    assert "TensorBoardOutputConfig" not in req


def test_training_image_says_where_it_came_from(monkeypatch):
    monkeypatch.setattr(images, "sdk_problem", lambda: "the SageMaker Python SDK is not installed")
    uri, source = images.training_image("2.5", "us-east-1", ["ml.c5.9xlarge", "ml.p3.2xlarge"])
    assert source == images.TABLE and uri.startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5")
    if sdk_problem() is not None:
        pytest.skip(f"SDK part: {sdk_problem()}")
    monkeypatch.undo()
    uri, source = images.training_image("2.5", "us-east-1", ["ml.c5.9xlarge", "ml.p3.2xlarge"])
    assert source == images.SDK and uri == "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5-gpu-py311"
    with pytest.raises(SubmitError, match="--framework-version '9.9'"):
        images.training_image("9.9", "us-east-1", ["ml.p3.2xlarge"])


@pytest.mark.parametrize("version, message", [
    ("2.257.7", "this needs the v3 ModelTrainer: pip uninstall -y sagemaker && pip install 'sagemaker>=3.18,<4'"),
    ("3.17.0", "sagemaker 3.17.0 is older than 3.18"),
    ("3.4.1", "older than 3.18"),
    ("4.0.0", "sagemaker 4.0.0 is a major version"),
])
def test_sdk_versions_that_cannot_be_used(version, message):
    assert message in sdk_problem(version)


def test_sdk_versions_that_can():
    assert sdk_problem("3.18.0") is None and sdk_problem("3.27.0") is None and sdk_problem("3.30.1rc1") is None


def test_the_image_folder_pipeline_declares_it_reads_either_input_mode(capsys):
    (req,), _ = dry_run(HET + ["--input", "s3://bkt/d", "--input-mode", "FastFile", "--hyperparameters",
                               "pipeline=data_service.pipelines.images:build_pipeline"], capsys)
    assert req["InputDataConfig"][0]["InputMode"] == "FastFile"
    import data_service.pipelines.images

    assert data_service.pipelines.images.build_pipeline.input_modes == ("File", "FastFile")


def test_shards_read_directly_need_no_channel_and_the_dry_run_says_so(capsys):
    (req,), err = dry_run(HET + ["--shards", "s3://bkt/imagenet-shards/"], capsys)
    hps = req["HyperParameters"]
    assert hps["pipeline"] == "data_service.pipelines.images:build_pipeline"
    assert hps["pipeline.shards"] == hps["model.shards"] == "s3://bkt/imagenet-shards"
    assert (hps["model"], hps["step"]) == ("examples.imagefolder:resnet18", "examples.imagefolder:train_step")
    assert not any(c["ChannelName"] == "train" for c in req.get("InputDataConfig", []))
    assert "read directly by the data nodes" in err and "s3:GetObject" in err
    (req,), _ = dry_run(HET + ["--shards", "s3://bkt/s", "--hyperparameters", "pipeline=mypkg.data:build"], capsys)
    assert req["HyperParameters"]["pipeline"] == "mypkg.data:build" and "model" not in req["HyperParameters"]
    assert main(BASE + HET + ["--shards", "/local/path", "--dry-run"]) == 2
    assert "--shards '/local/path' must be an S3 URI" in capsys.readouterr().err
