"""A data-only training job that adds data nodes to a running heterogeneous job.

``hetero submit --join JOB`` reads the running job with ``DescribeTrainingJob`` and writes a
second job from it: the same training image, role, code and pipeline hyperparameters, the same
input channels (those the running job sends to its data groups), the same job secret (or its
Secrets Manager ARN) and the same ``VpcConfig``, but only one instance group, of data nodes.
Its hyperparameters ``join`` (the running job's ``registry``) and ``job_name`` (the running
job's name, which the job token is derived from) make its data servers register in the
running job's registry with a proof of that job's token; the running job's consumers watch the
registry and start using them.

The running job must be in progress, must have a ``registry`` hyperparameter on S3 (submitted
with ``hetero submit --registry``) and must run in a VPC: servers of another job reach its
consumers only through the VPC's subnets and security groups. Given subnets and security
groups must match the running job's (the same security groups, subnets among its subnets).
"""
from __future__ import annotations

import json
import time

from hetero.sagemaker.spec import DATA, DNN, Channel, Group, JobSpec, SubmitError

JOIN_HP, JOIN_JOB_HP, REGISTRY_HP = "join", "job_name", "registry"
# Hyperparameters the data-only job sets itself rather than copying from the running job.
_OWN_HPS = ("sagemaker_job_name", "sagemaker_region", "data_group", "dnn_group", REGISTRY_HP, JOIN_HP, JOIN_JOB_HP)
_RUNNING = "InProgress"


def describe(clients, job_name: str) -> dict:
    """``DescribeTrainingJob`` of ``job_name`` (botocore's ClientError when AWS refuses)."""
    return clients.sagemaker.describe_training_job(TrainingJobName=job_name)


def _plain(value) -> str:
    """A hyperparameter as the launcher reads it: SDK v2 JSON-quotes strings, ``"\\"s3://..\\""``."""
    text = str(value)
    if text.startswith('"'):
        try:
            decoded = json.loads(text)
            return decoded if isinstance(decoded, str) else text
        except json.JSONDecodeError:
            return text
    return text


def registry_of(job: dict) -> str:
    """The running job's ``registry`` hyperparameter (an S3 URI), or SubmitError with the fix."""
    name = job["TrainingJobName"]
    registry = _plain(job.get("HyperParameters", {}).get(REGISTRY_HP, "")).strip()
    if not registry:
        raise SubmitError(f"training job {name!r} has no {REGISTRY_HP!r} hyperparameter: its consumers watch no "
                          "registry, so servers of another job cannot join it. Submit the job with a registry "
                          "(hetero submit ... --registry s3://bucket/prefix, or --registry alone for "
                          "<output>/<job>/registry) and join that job")
    if not registry.startswith("s3://"):
        raise SubmitError(f"training job {name!r} has registry {registry!r}, a folder on its own nodes that another "
                          "job cannot write to; submit it with an S3 registry (--registry s3://bucket/prefix)")
    return registry.rstrip("/")


def check_vpc(job: dict, given: dict | None) -> dict:
    """The ``VpcConfig`` for the joining job: the running job's, checked against ``given``.

    Raises:
        SubmitError: the running job has no VpcConfig, or ``given`` does not match it (naming both).
    """
    name = job["TrainingJobName"]
    running = job.get("VpcConfig")
    if not running or not running.get("Subnets") or not running.get("SecurityGroupIds"):
        raise SubmitError(f"training job {name!r} runs without a VpcConfig: nodes of another job cannot reach its "
                          "data plane. Submit it in a VPC (hetero submit ... --subnet subnet-... --security-group "
                          "sg-...) and join that job; see docs/elastic.md for the network set-up")
    mine = {"Subnets": list(running["Subnets"]), "SecurityGroupIds": list(running["SecurityGroupIds"])}
    if given is None:
        return mine
    same_groups = set(given["SecurityGroupIds"]) == set(running["SecurityGroupIds"])
    inside = set(given["Subnets"]) <= set(running["Subnets"])
    if not (same_groups and inside):
        raise SubmitError(f"--subnet/--security-group give VpcConfig {given}, but training job {name!r} runs in "
                          f"{mine}: the joining data nodes must use the running job's security group(s) and some of "
                          "its subnets. Omit --subnet/--security-group to use the running job's, or give those")
    return {"Subnets": list(given["Subnets"]), "SecurityGroupIds": list(given["SecurityGroupIds"])}


def data_channels(job: dict, group_name: str) -> list[Channel]:
    """The running job's input channels that reach its data nodes, sent to ``group_name``."""
    hps = job.get("HyperParameters", {})
    data_groups = {g.strip() for g in _plain(hps.get("data_group", "data_group")).split(",") if g.strip()}
    out = []
    for ch in job.get("InputDataConfig", []):
        source = ch.get("DataSource", {}).get("S3DataSource")
        if not source:
            continue
        groups = source.get("InstanceGroupNames")
        if groups and not data_groups & set(groups):
            continue  # a channel of the DNN nodes only
        out.append(Channel(ch["ChannelName"], source["S3Uri"], (group_name,), ch.get("InputMode", "File")))
    return out


def data_instance(job: dict) -> str:
    """The instance type of the running job's (first) data group."""
    hps = job.get("HyperParameters", {})
    names = [g.strip() for g in _plain(hps.get("data_group", "data_group")).split(",") if g.strip()]
    for group in job.get("ResourceConfig", {}).get("InstanceGroups", []):
        if group.get("InstanceGroupName") in names:
            return group["InstanceType"]
    raise SubmitError(f"training job {job['TrainingJobName']!r} has no data group {names} in its ResourceConfig: "
                      "only a heterogeneous job with a data group can be joined")


def join_spec(job: dict, *, job_name: str, group: Group | None, vpc: dict | None, role: str | None,
              image: str | None, output: str | None, region: str, max_run_s: int, spot: bool = False,
              hyperparameters: dict | None = None, tags: dict | None = None) -> JobSpec:
    """The data-only JobSpec joining the running job ``job`` (a DescribeTrainingJob response).

    Args:
        job: the running job's description.
        job_name: the new job's name.
        group: the data group (default: one node of the running job's data instance type).
        vpc: ``--subnet``/``--security-group`` as VpcConfig, checked against the running job's.
        role, image, output: overrides (default: the running job's).
        region: AWS region.
        max_run_s, spot: the new job's stopping condition and spot use.
        hyperparameters: more hyperparameters (over the copied ones).
        tags: resource tags.

    Raises:
        SubmitError: the running job cannot be joined (status, registry, VPC), naming the fix.
    """
    name = job["TrainingJobName"]
    status = job.get("TrainingJobStatus")
    if status != _RUNNING:
        raise SubmitError(f"training job {name!r} is {status}, not {_RUNNING}: only a running job can be joined")
    registry = registry_of(job)
    vpc_config = check_vpc(job, vpc)
    group = group or Group("data_group", data_instance(job), 1, DATA)
    if group.role == DNN:
        raise SubmitError("a joining job has data nodes only: give --data-group TYPE:COUNT")
    # The running job's autoscaler settings are its rank 0's: a data node has none, and with
    # autoscale.mode=act and no registry of its own a joiner's launcher would refuse to start.
    hps = {k: _plain(v) if k == "sagemaker_submit_directory" else v
           for k, v in job.get("HyperParameters", {}).items() if k not in _OWN_HPS and not k.startswith("autoscale.")}
    hps.update({JOIN_HP: registry, JOIN_JOB_HP: name, **(hyperparameters or {})})
    env = dict(job.get("Environment", {}))
    secret, secret_arn = env.pop("HETERO_JOB_SECRET", None), env.pop("HETERO_JOB_SECRET_ARN", None)
    spec = JobSpec(job_name=job_name, role=role or job["RoleArn"],
                   image=image or job["AlgorithmSpecification"]["TrainingImage"], groups=[group],
                   output=output or job["OutputDataConfig"]["S3OutputPath"], region=region,
                   channels=data_channels(job, group.name), hyperparameters=hps, max_run_s=max_run_s, spot=spot,
                   volume_gb=job.get("ResourceConfig", {}).get("VolumeSizeInGB", 30), source_s3=None,
                   environment=env, tags={"hetero:mode": "join", "hetero:joins": name, **(tags or {})},
                   vpc=vpc_config, job_secret_arn=secret_arn)
    if secret:
        spec.job_secret = secret
    elif not spec.job_secret_arn:
        raise SubmitError(f"training job {name!r} has neither HETERO_JOB_SECRET nor HETERO_JOB_SECRET_ARN in its "
                          "Environment: the joining nodes could not derive its job token")
    return spec


def default_join_name(running: str) -> str:
    """``<running>-join-<HHMMSS>``, cut to SageMaker's 63 characters."""
    suffix = time.strftime("-join-%H%M%S", time.gmtime())
    return running[:63 - len(suffix)].rstrip("-") + suffix
