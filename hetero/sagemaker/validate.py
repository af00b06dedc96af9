"""Check a CreateTrainingJob request before anything is sent.

Two layers: botocore's own ``ParamValidator`` against the ``sagemaker`` service model
(missing fields, wrong types, minimum lengths), then the rules it does not enforce but
the API does (at most 5 instance groups, group names 1-64 chars and unique,
InstanceType/InstanceCount never beside InstanceGroups, channels naming existing groups,
instance types from the model's enum, name patterns, hyperparameter limits, spot waits).
No credentials and no network are needed.
"""
from __future__ import annotations

import difflib
import functools
import re

from hetero.sagemaker.spec import MAX_RUN_LIMIT_S, SubmitError

MAX_GROUPS = 5
MAX_GROUPS_PER_CHANNEL = 5
MAX_HYPERPARAMETERS = 100
_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
_CHANNEL = re.compile(r"^[A-Za-z0-9.\-_]{1,64}$")
_ROLE = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$")


@functools.lru_cache(maxsize=1)
def _model():
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def input_shape():
    """botocore's input shape of CreateTrainingJob."""
    return _model().operation_model("CreateTrainingJob").input_shape


def instance_types() -> frozenset[str]:
    """Training instance types the installed botocore knows (the API's enum)."""
    return frozenset(_model().shape_for("TrainingInstanceType").enum)


def botocore_errors(request: dict) -> list[str]:
    """What botocore's own validator finds wrong (empty list when it accepts the request)."""
    from botocore.validate import ParamValidator

    report = ParamValidator().validate(request, input_shape())
    if not report.has_errors():
        return []
    return [line.strip() for line in report.generate_report().splitlines() if line.strip()]


def _instance_type(value: str, where: str) -> list[str]:
    known = instance_types()
    if value in known:
        return []
    close = difflib.get_close_matches(str(value), sorted(known), n=3)
    hint = f"did you mean {', '.join(close)}?" if close else "see the sagemaker TrainingInstanceType list"
    return [f"{where}: unknown instance type {value!r}; {hint}"]


def _resources(res: dict) -> tuple[list[str], set[str]]:
    problems: list[str] = []
    groups = res.get("InstanceGroups")
    if groups is None:
        if res.get("InstanceType") is None or res.get("InstanceCount") is None:
            problems.append("ResourceConfig needs InstanceType and InstanceCount, or InstanceGroups")
        else:
            problems += _instance_type(res["InstanceType"], "ResourceConfig.InstanceType")
            if isinstance(res["InstanceCount"], int) and res["InstanceCount"] < 1:
                problems.append(f"ResourceConfig.InstanceCount is {res['InstanceCount']}; give at least 1")
        return problems, set()
    for key in ("InstanceType", "InstanceCount"):
        if key in res:
            problems.append(f"ResourceConfig.{key} must not be set together with InstanceGroups "
                            "(the API rejects it); give each group its own type and count")
    if not 1 <= len(groups) <= MAX_GROUPS:
        problems.append(f"{len(groups)} instance groups; SageMaker allows 1 to {MAX_GROUPS}")
    names: set[str] = set()
    for i, group in enumerate(groups):
        name = group.get("InstanceGroupName", "")
        where = f"instance group {name!r}" if name else f"InstanceGroups[{i}]"
        if not isinstance(name, str) or not 1 <= len(name) <= 64:
            problems.append(f"{where}: group names must be 1-64 characters")
        elif name in names:
            problems.append(f"{where}: duplicate group name; names must be unique")
        names.add(name)
        problems += _instance_type(group.get("InstanceType"), where)
        count = group.get("InstanceCount")
        if isinstance(count, int) and count < 1:
            problems.append(f"{where}: InstanceCount is {count}; give at least 1 instance or drop the group")
    return problems, names


def _channels(channels: list[dict], group_names: set[str]) -> list[str]:
    problems, seen, assigned = [], set(), []
    for channel in channels:
        name = channel.get("ChannelName", "")
        if not _CHANNEL.match(str(name)):
            problems.append(f"channel name {name!r}: use 1-64 letters, digits, '.', '-' or '_'")
        if name in seen:
            problems.append(f"channel {name!r} appears twice; give each --input its own NAME=")
        seen.add(name)
        s3 = channel.get("DataSource", {}).get("S3DataSource", {})
        restricted = s3.get("InstanceGroupNames")
        if restricted is None:
            continue
        assigned.append(channel.get("ChannelName"))
        if not group_names:
            problems.append(f"channel {name!r} names instance groups but the job has none (homogeneous)")
        if len(restricted) > MAX_GROUPS_PER_CHANNEL:
            problems.append(f"channel {name!r} names {len(restricted)} groups; at most {MAX_GROUPS_PER_CHANNEL}")
        for group in restricted:
            if group_names and group not in group_names:
                problems.append(f"channel {name!r} is restricted to unknown instance group {group!r}; "
                                f"known groups: {', '.join(sorted(group_names))} (use @GROUP with one of them)")
    if group_names and assigned and len(assigned) < len(channels):
        rest = [c.get("ChannelName") for c in channels if c.get("ChannelName") not in assigned]
        problems.append(f"channels {assigned} are assigned to instance groups but {rest} are not; SageMaker "
                        f"takes all or none: add @GROUP to those too (e.g. @{'+'.join(sorted(group_names))})")
    return problems


def _rest(request: dict) -> list[str]:
    problems = []
    name = request.get("TrainingJobName", "")
    if not _JOB_NAME.match(str(name)):
        problems.append(f"job name {name!r}: use 1-63 letters, digits and hyphens, starting with a letter or digit")
    role = request.get("RoleArn")
    if role and not _ROLE.match(str(role)):
        problems.append(f"role {role!r} is not an IAM role ARN like arn:aws:iam::123456789012:role/SageMakerRole")
    hps = request.get("HyperParameters", {})
    if len(hps) > MAX_HYPERPARAMETERS:
        problems.append(f"{len(hps)} hyperparameters; SageMaker allows at most {MAX_HYPERPARAMETERS}")
    for key, value in hps.items():
        if not 1 <= len(key) <= 256 or len(str(value)) > 2500:
            problems.append(f"hyperparameter {key[:40]!r}: keys are 1-256 chars and values at most 2500")
    env = request.get("Environment", {})
    if len(env) > 100 or any(len(k) > 512 or len(str(v)) > 512 for k, v in env.items()):
        problems.append("Environment: at most 100 variables, names and values at most 512 chars each")
    stop = request.get("StoppingCondition", {})
    run, wait = stop.get("MaxRuntimeInSeconds"), stop.get("MaxWaitTimeInSeconds")
    if isinstance(run, int) and not 1 <= run <= MAX_RUN_LIMIT_S:
        problems.append(f"max run {run} s: must be 1 s to 28 days ({MAX_RUN_LIMIT_S} s)")
    if wait is not None and not request.get("EnableManagedSpotTraining"):
        problems.append("MaxWaitTimeInSeconds is only for spot training; add --spot or drop --max-wait")
    if isinstance(wait, int) and isinstance(run, int) and wait < run:
        problems.append(f"max wait {wait} s is shorter than max run {run} s; it must be >= max run")
    return problems


def check_request(request: dict) -> None:
    """Raise SubmitError listing every problem in ``request``; return None when it is fine."""
    problems = [f"botocore: {p}" for p in botocore_errors(request)]
    res_problems, group_names = _resources(request.get("ResourceConfig", {}))
    problems += res_problems
    problems += _channels(request.get("InputDataConfig", []), group_names)
    problems += _rest(request)
    if problems:
        name = request.get("TrainingJobName", "?")
        raise SubmitError(f"training job {name!r} would be rejected:\n  - " + "\n  - ".join(problems))
