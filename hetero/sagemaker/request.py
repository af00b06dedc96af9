"""Turn a JobSpec into a boto3 ``create_training_job`` request (a plain dict).

A heterogeneous job sends ``ResourceConfig.InstanceGroups`` (never InstanceType /
InstanceCount beside it); a homogeneous one sends InstanceType/InstanceCount. Both run
the same code in script mode: the sagemaker-training toolkit in the image downloads
``sagemaker_submit_directory`` (our sourcedir.tar.gz) and runs ``sagemaker_program``.
"""
from __future__ import annotations

import copy
from dataclasses import replace
import secrets
from typing import Any
from datetime import datetime, timezone

from hetero.sagemaker.spec import (DATA, DNN, ENTRY_POINT, SECRET_ARN_ENV, SECRET_ENV, SECRET_HP, Channel, Group,
                                   JobSpec, SubmitError)
from launcher.metric_lines import metric_definitions

MASK = "****"
CHECKPOINT_LOCAL = "/opt/ml/checkpoints"
# Where the trainer writes TensorBoard events (its output dir, SM_OUTPUT_DATA_DIR, + tensorboard):
# TensorBoardOutputConfig.LocalPath must name that folder for SageMaker to upload it as it grows.
TENSORBOARD_LOCAL = "/opt/ml/output/data/tensorboard"
_TRUE = ("true", "1", "yes")

# AWS Deep Learning Containers, PyTorch training, GPU flavour (one image serves every group:
# the CUDA libraries simply go unused on CPU instances). Verify tags against
# https://github.com/aws/deep-learning-containers/blob/master/available_images.md
DLC_ACCOUNT = "763104351884"
PYTORCH_TAGS = {
    "2.2": "2.2.0-gpu-py310-cu121-ubuntu20.04-sagemaker",
    "2.3": "2.3.0-gpu-py311-cu121-ubuntu20.04-sagemaker",
    "2.4": "2.4.0-gpu-py311-cu124-ubuntu22.04-sagemaker",
    "2.5": "2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker",
    "2.6": "2.6.0-gpu-py312-cu126-ubuntu22.04-sagemaker",
}


def framework_image(version: str, region: str) -> str:
    """PyTorch training DLC URI for ``version`` ("2.2" or "2.2.0") in ``region`` from the tag table
    above (the fallback of ``images.training_image`` when the SageMaker SDK is not installed)."""
    key = ".".join(str(version).split(".")[:2])
    if key not in PYTORCH_TAGS:
        raise SubmitError(f"--framework-version {version!r} is not one we know; use one of "
                          f"{', '.join(PYTORCH_TAGS)} or pass the image with --image URI")
    if region.startswith(("cn-", "us-gov-")) or region in ("ap-east-1", "me-south-1", "af-south-1"):
        raise SubmitError(f"region {region!r} serves the DLC images from another account; pass --image URI")
    return f"{DLC_ACCOUNT}.dkr.ecr.{region}.amazonaws.com/pytorch-training:{PYTORCH_TAGS[key]}"


def default_job_name(kind: str) -> str:
    """``hetero-<kind>-YYYYmmdd-HHMMSS-xxxx`` (unique enough, <= 63 chars)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"hetero-{kind}-{stamp}-{secrets.token_hex(2)}"


def _channel(channel: Channel, homogeneous: bool) -> dict:
    source: dict[str, Any] = {"S3DataType": "S3Prefix", "S3Uri": channel.s3_uri, "S3DataDistributionType": "FullyReplicated"}
    if channel.groups:
        if homogeneous:
            raise SubmitError(f"input channel {channel.name!r} is restricted to {'+'.join(channel.groups)}, "
                              "but a homogeneous job has no instance groups; drop the @GROUP part")
        source["InstanceGroupNames"] = list(channel.groups)
    return {"ChannelName": channel.name, "DataSource": {"S3DataSource": source}, "InputMode": channel.input_mode}


def hyperparameters(spec: JobSpec) -> dict[str, str]:
    """The HyperParameters map: script-mode keys, the launcher's role options, then the user's.

    ``data_group`` / ``dnn_group`` list the groups of each role (comma-separated), as the
    launcher expects; a homogeneous job gets neither (its one group trains).
    """
    hps = {"sagemaker_program": ENTRY_POINT, "sagemaker_region": spec.region,
           "sagemaker_container_log_level": "20", "sagemaker_job_name": spec.job_name}
    if spec.source_s3:
        hps["sagemaker_submit_directory"] = spec.source_s3
    if not spec.homogeneous:
        for role in (DATA, DNN):
            names = [g.name for g in spec.groups if g.role == role]
            if names:
                hps[f"{role}_group"] = ",".join(names)
    hps.update(spec.hyperparameters)
    if SECRET_HP in hps:
        raise SubmitError(f"the job secret goes in the container variable {SECRET_ENV}, not the {SECRET_HP} "
                          "hyperparameter (hyperparameters are logged): use --job-secret")
    return hps


def autoscale_acts(hps: dict) -> bool:
    """Whether the job's rank 0 prints ``autoscale`` lines: ``autoscale.mode=act`` in a job that
    trains (a data-only job joining another has no rank 0, whatever hyperparameters it copied)."""
    mode = str(hps.get("autoscale.mode", "")).strip().strip('"').strip().lower()
    return mode == "act" and not hps.get("join")


def tensorboard_enabled(spec: JobSpec) -> bool:
    """Whether the job's ``tensorboard`` hyperparameter asks the trainer for TensorBoard events."""
    return str(spec.hyperparameters.get("tensorboard", "")).strip().lower() in _TRUE


def secret_environment(spec: JobSpec) -> dict[str, str]:
    """The container variables that give the nodes the job secret: its Secrets Manager ARN when
    the spec has one (the value never enters the request), else the secret itself."""
    if spec.job_secret_arn:
        return {SECRET_ARN_ENV: spec.job_secret_arn}
    return {SECRET_ENV: spec.job_secret}


def secret_notice(spec: JobSpec) -> str:
    """One plain sentence on where the job secret travels and who can read it."""
    joined = spec.tags.get("hetero:joins")
    if joined:
        where = (f"from AWS Secrets Manager ({spec.job_secret_arn})" if spec.job_secret_arn
                 else f"in clear as the container variable {SECRET_ENV} (shown as **** here)")
        return (f"job secret: job {joined}'s, read {where} as that job does, so these nodes derive its "
                "token; whoever may describe either job (or read the secret) can reach its data servers.")
    if spec.job_secret_arn:
        return (f"job secret: read by every node at start from AWS Secrets Manager ({spec.job_secret_arn}); "
                "it is not in the request. The execution role needs secretsmanager:GetSecretValue on it "
                "(and kms:Decrypt if a customer-managed key encrypts it); whoever may read the secret can "
                "derive the job token.")
    return (f"job secret: a random per-job value sent in clear as the container variable {SECRET_ENV} "
            "(shown as **** here). Anyone allowed sagemaker:DescribeTrainingJob on this job can read it, "
            "and with it reach the job's data servers; use --job-secret-arn to keep it in AWS Secrets "
            "Manager instead.")


def build_request(spec: JobSpec) -> dict:
    """The CreateTrainingJob request for ``spec`` (not yet validated: see validate.py)."""
    if spec.homogeneous:
        if len(spec.groups) != 1:
            raise SubmitError(f"a homogeneous job has exactly one instance type, got {len(spec.groups)} groups")
        resources = {"InstanceType": spec.groups[0].instance_type, "InstanceCount": spec.groups[0].count}
    else:
        resources = {"InstanceGroups": [{"InstanceType": g.instance_type, "InstanceCount": g.count,
                                         "InstanceGroupName": g.name} for g in spec.groups]}
    resources["VolumeSizeInGB"] = spec.volume_gb
    stopping: dict[str, Any] = {"MaxRuntimeInSeconds": spec.max_run_s}
    hps = hyperparameters(spec)
    request: dict[str, Any] = {
        "TrainingJobName": spec.job_name,
        "RoleArn": spec.role,
        "AlgorithmSpecification": {"TrainingImage": spec.image, "TrainingInputMode": "File",
                                   "MetricDefinitions": metric_definitions(autoscale=autoscale_acts(hps)),
                                   "EnableSageMakerMetricsTimeSeries": True},
        "HyperParameters": hps,
        "OutputDataConfig": {"S3OutputPath": spec.output},
        "ResourceConfig": resources,
        "StoppingCondition": stopping,
        "Tags": [{"Key": k, "Value": v} for k, v in sorted(spec.tags.items())],
    }
    if spec.channels:
        request["InputDataConfig"] = [_channel(c, spec.homogeneous) for c in spec.channels]
    env = {k: v for k, v in spec.environment.items() if k not in (SECRET_ENV, SECRET_ARN_ENV)}
    request["Environment"] = {**env, **secret_environment(spec)}
    if spec.vpc:
        request["VpcConfig"] = {"Subnets": list(spec.vpc["Subnets"]),
                                "SecurityGroupIds": list(spec.vpc["SecurityGroupIds"])}
    if tensorboard_enabled(spec):
        request["TensorBoardOutputConfig"] = {"S3OutputPath": f"{spec.output}/{spec.job_name}/tensorboard",
                                              "LocalPath": TENSORBOARD_LOCAL}
    if spec.spot:
        request["EnableManagedSpotTraining"] = True
        stopping["MaxWaitTimeInSeconds"] = spec.max_wait_s or spec.max_run_s + 3600
        checkpoint = spec.checkpoint_s3 or f"{spec.output}/{spec.job_name}/checkpoints"
        request["CheckpointConfig"] = {"S3Uri": checkpoint, "LocalPath": CHECKPOINT_LOCAL}
    elif spec.max_wait_s:
        raise SubmitError("--max-wait only applies to spot training; add --spot or drop --max-wait")
    elif spec.checkpoint_s3:
        request["CheckpointConfig"] = {"S3Uri": spec.checkpoint_s3, "LocalPath": CHECKPOINT_LOCAL}
    return request


def homogeneous_twin(spec: JobSpec, instance: tuple[str, int] | None = None, job_name: str | None = None) -> JobSpec:
    """The benchmark partner of a heterogeneous job: same code, image, data and hyperparameters
    on one instance type (default: the dnn group's), with a fresh job secret.

    Channel restrictions to a group are dropped: the single group reads every channel; so is a
    ``registry`` (the twin has no data servers for others to join).
    """
    if instance is None:
        dnn = [g for g in spec.groups if g.role == DNN] or spec.groups[-1:]
        instance = (dnn[0].instance_type, dnn[0].count)
    return spec.copy(job_name=job_name or f"{spec.job_name}-hom", homogeneous=True,
                     groups=[Group("homogeneousCluster", *instance)],
                     channels=[replace(c, groups=()) for c in spec.channels],
                     hyperparameters={k: v for k, v in spec.hyperparameters.items() if k != "registry"},
                     job_secret=secrets.token_hex(16), tags={**spec.tags, "hetero:mode": "homogeneous"},
                     vpc=dict(spec.vpc) if spec.vpc else None)


def make_pair(spec: JobSpec, instance: tuple[str, int] | None = None) -> tuple[JobSpec, JobSpec]:
    """The benchmark pair: ``<name>-het`` (``spec``'s groups) and ``<name>-hom`` (its twin)."""
    if spec.homogeneous:
        raise SubmitError("--pair needs the heterogeneous groups (--data-group/--dnn-group/--group)")
    hetero = spec.copy(job_name=f"{spec.job_name}-het", tags={**spec.tags, "hetero:pair": spec.job_name,
                                                              "hetero:mode": "heterogeneous"})
    twin = homogeneous_twin(hetero, instance, job_name=f"{spec.job_name}-hom")
    return hetero, twin


def masked(request: dict) -> dict:
    """A deep copy of ``request`` with the job secret replaced by ``****`` (for printing)."""
    out = copy.deepcopy(request)
    for where, key in (("Environment", SECRET_ENV), ("HyperParameters", SECRET_HP)):
        if key in out.get(where, {}):
            out[where][key] = MASK
    return out
