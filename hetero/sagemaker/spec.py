"""What a training job is made of, and parsing of the CLI's compact forms.

``JobSpec`` holds everything ``request.build_request`` turns into a CreateTrainingJob
request. The ``parse_*`` helpers turn ``TYPE:COUNT``, ``NAME=TYPE:COUNT``,
``[NAME=]S3URI[@GROUP[+GROUP]]``, ``90m`` and ``k=v`` strings into values and raise
``SubmitError`` (naming the bad value and the fix) before any AWS call.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field, replace

from data_service.errors import ConfigError

DEFAULT_CHANNEL = "train"
ENTRY_POINT = "launcher/entry.py"
SECRET_ENV = "HETERO_JOB_SECRET"   # the launcher's preferred source of the job secret
SECRET_HP = "job_secret"            # the launcher's fallback hyperparameter (never sent by us)
SECRET_ARN_ENV = "HETERO_JOB_SECRET_ARN"  # where to fetch the secret from on each node instead
INPUT_MODES = ("File", "FastFile")  # Pipe: the pipelines read files, not a FIFO stream
DATA, DNN = "data", "dnn"
MAX_RUN_LIMIT_S = 28 * 24 * 3600  # CreateTrainingJob's limit on MaxRuntimeInSeconds

_DURATION = re.compile(r"^(\d+)\s*([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class SubmitError(ConfigError):
    """A job description that SageMaker would reject, or that we refuse to submit."""


@dataclass(frozen=True)
class Group:
    """One instance group: name, instance type, number of instances and launcher role.

    ``role`` is ``"data"`` (serves batches) or ``"dnn"`` (trains); it becomes the
    launcher's ``data_group`` / ``dnn_group`` hyperparameters.
    """

    name: str
    instance_type: str
    count: int
    role: str = DATA


@dataclass(frozen=True)
class Channel:
    """One S3 input channel, optionally sent only to some instance groups.

    ``input_mode``: ``File`` (SageMaker copies the data to the node before the job starts) or
    ``FastFile`` (the data is streamed from S3 on first read, at the same path).
    """

    name: str
    s3_uri: str
    groups: tuple[str, ...] = ()
    input_mode: str = "File"


@dataclass
class JobSpec:
    """A SageMaker training job, heterogeneous (several groups) or homogeneous (one).

    Attributes:
        job_name: TrainingJobName (1-63 chars, letters, digits, hyphens).
        role: IAM role ARN SageMaker assumes.
        image: training image URI.
        groups: instance groups; for a homogeneous job exactly one (its name is not sent).
        homogeneous: send InstanceType/InstanceCount instead of InstanceGroups.
        output: S3 URI for OutputDataConfig.S3OutputPath.
        region: AWS region (also sent as the sagemaker_region hyperparameter).
        channels: S3 input channels.
        hyperparameters: user hyperparameters (strings, sent as given).
        max_run_s: StoppingCondition.MaxRuntimeInSeconds.
        spot: use managed spot training.
        max_wait_s: MaxWaitTimeInSeconds (spot only; default max_run_s + 1 h).
        checkpoint_s3: CheckpointConfig.S3Uri (spot default: under the output path).
        volume_gb: EBS volume per instance.
        source_s3: S3 URI of sourcedir.tar.gz, or None when the image holds the code.
        job_secret: secret the launcher derives the job token from (sent as the container
            variable HETERO_JOB_SECRET; never printed). Ignored when ``job_secret_arn`` is set.
        job_secret_arn: AWS Secrets Manager secret holding the job secret; only its ARN is sent
            (HETERO_JOB_SECRET_ARN) and every node reads the value at start.
        environment: container environment variables.
        tags: resource tags.
        vpc: ``VpcConfig`` (``{"Subnets": [...], "SecurityGroupIds": [...]}``), or None: the
            job runs in SageMaker's own network.
    """

    job_name: str
    role: str
    image: str
    groups: list[Group]
    output: str
    region: str
    homogeneous: bool = False
    channels: list[Channel] = field(default_factory=list)
    hyperparameters: dict[str, str] = field(default_factory=dict)
    max_run_s: int = 24 * 3600
    spot: bool = False
    max_wait_s: int | None = None
    checkpoint_s3: str | None = None
    volume_gb: int = 30
    source_s3: str | None = None
    job_secret: str = field(default_factory=lambda: secrets.token_hex(16))
    job_secret_arn: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    vpc: dict | None = None

    def cluster(self) -> list[tuple[str, int]]:
        """``[(instance_type, count), ...]`` for hetero.planning.cost."""
        return [(g.instance_type, g.count) for g in self.groups]

    def copy(self, **changes) -> "JobSpec":
        """A copy with ``changes`` applied (lists and dicts are copied, not shared)."""
        base = replace(self, groups=list(self.groups), channels=list(self.channels),
                       hyperparameters=dict(self.hyperparameters), environment=dict(self.environment),
                       tags=dict(self.tags))
        return replace(base, **changes)


def parse_type_count(text: str, option: str) -> tuple[str, int]:
    """``"ml.c5.9xlarge:2"`` -> ``("ml.c5.9xlarge", 2)``; the count must be >= 1."""
    instance_type, sep, count = (text or "").strip().rpartition(":")
    if not sep or not instance_type or not re.fullmatch(r"\d+", count):
        raise SubmitError(f"{option} {text!r} must look like TYPE:COUNT, e.g. ml.c5.9xlarge:1")
    if not instance_type.startswith("ml."):
        raise SubmitError(f"{option} {text!r}: SageMaker instance types start with 'ml.', "
                          f"e.g. ml.{instance_type}:{count}")
    if int(count) < 1:
        raise SubmitError(f"{option} {text!r}: a group needs at least 1 instance; drop the group "
                          "or give a count >= 1")
    return instance_type, int(count)


def parse_group(text: str, option: str = "--group") -> Group:
    """``"[data:|dnn:]NAME=TYPE:COUNT"`` -> Group; the role defaults to data.

    Example: ``"dnn:gpu2=ml.g5.2xlarge:2"`` -> ``Group("gpu2", "ml.g5.2xlarge", 2, "dnn")``.
    """
    role, name = DATA, text or ""
    for prefix in (DATA, DNN):
        if name.startswith(prefix + ":"):
            role, name = prefix, name[len(prefix) + 1:]
    name, sep, rest = name.partition("=")
    if not sep or not name:
        raise SubmitError(f"{option} {text!r} must look like [data:|dnn:]NAME=TYPE:COUNT, "
                          "e.g. aug_group=ml.c5.4xlarge:2 or dnn:gpu2=ml.g5.2xlarge:1")
    return Group(name, *parse_type_count(rest, option), role)


def parse_input(text: str, default_name: str = DEFAULT_CHANNEL) -> Channel:
    """``[NAME=]s3://bucket/prefix[@GROUP[+GROUP...]]`` -> Channel."""
    name, sep, rest = text.partition("=")
    if not sep or "://" in name:
        name, rest = default_name, text
    uri, at, groups = rest.rpartition("@")
    if not at or "/" in groups:  # no @, or an @ inside the S3 key
        uri, at, groups = rest, "", ""
    if not uri.startswith("s3://") or len(uri) <= len("s3://"):
        raise SubmitError(f"--input {text!r}: the data must be an S3 URI like s3://bucket/prefix "
                          "(optionally NAME=s3://...@GROUP)")
    group_names = tuple(g for g in groups.split("+") if g)
    if at and not group_names:
        raise SubmitError(f"--input {text!r}: nothing after '@'; name the instance group, e.g. @data_group")
    return Channel(name, uri, group_names)


def apply_input_modes(channels: list[Channel], items: list[str] | None) -> list[Channel]:
    """Apply ``--input-mode`` values: ``MODE`` sets every channel, ``NAME=MODE`` one channel
    (later items win, so ``FastFile images=File`` streams all but ``images``)."""
    out = list(channels)
    for item in items or []:
        name, sep, mode = item.rpartition("=")
        canonical = {m.lower(): m for m in INPUT_MODES}.get(mode.strip().lower())
        if canonical is None:
            hint = " (Pipe mode is not supported: the pipelines read files)" if mode.lower() == "pipe" else ""
            raise SubmitError(f"--input-mode {item!r}: mode must be one of {', '.join(INPUT_MODES)}{hint}, "
                              "e.g. --input-mode FastFile or --input-mode train=FastFile")
        names = [c.name for c in out]
        if sep and name not in names:
            raise SubmitError(f"--input-mode {item!r}: no input channel {name!r}; the channels are "
                              f"{names or 'none (add --input NAME=s3://...)'}")
        if not sep and not out:
            raise SubmitError(f"--input-mode {item!r} but the job has no --input channel")
        out = [replace(c, input_mode=canonical) if not sep or c.name == name else c for c in out]
    return out


def check_secret_arn(arn: str) -> str:
    """``arn`` if it is a Secrets Manager secret ARN, else SubmitError naming the expected form."""
    if not re.fullmatch(r"arn:aws[a-z\-]*:secretsmanager:[a-z0-9\-]+:\d{12}:secret:[A-Za-z0-9/_+=.@\-]+", arn or ""):
        raise SubmitError(f"--job-secret-arn {arn!r} is not a Secrets Manager secret ARN like "
                          "arn:aws:secretsmanager:us-east-1:123456789012:secret:hetero-job-AbCdEf")
    return arn


def parse_duration(text: str | int, option: str = "--max-run") -> int:
    """``"3600"``, ``"90m"``, ``"2h"``, ``"1d"`` -> seconds (> 0)."""
    match = _DURATION.match(str(text).strip().lower())
    if not match or int(match.group(1)) <= 0:
        raise SubmitError(f"{option} {text!r} must be a positive duration like 3600, 90m, 2h or 1d")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_strings(items: list[str] | None, option: str) -> dict[str, str]:
    """``["a=1", "b=x y"]`` -> ``{"a": "1", "b": "x y"}``; values stay strings (as SageMaker takes them)."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SubmitError(f"{option} {item!r} must look like key=value")
        out[key] = value
    return out


def parse_vpc(subnets: list[str] | None, groups: list[str] | None) -> dict | None:
    """``--subnet`` / ``--security-group`` values (repeatable, or comma-separated) -> ``VpcConfig``,
    None when neither is given; both or neither."""
    subnet_ids = [s.strip() for item in subnets or [] for s in item.split(",") if s.strip()]
    group_ids = [g.strip() for item in groups or [] for g in item.split(",") if g.strip()]
    if not subnet_ids and not group_ids:
        return None
    if not subnet_ids or not group_ids:
        raise SubmitError("a VPC needs both --subnet and --security-group (e.g. --subnet subnet-0abc "
                          "--security-group sg-0def); give both or neither")
    bad = [s for s in subnet_ids if not re.fullmatch(r"subnet-[0-9a-z]+", s)] + \
        [g for g in group_ids if not re.fullmatch(r"sg-[0-9a-z]+", g)]
    if bad:
        raise SubmitError(f"{bad}: subnets look like subnet-0123abcd and security groups like sg-0123abcd")
    return {"Subnets": subnet_ids, "SecurityGroupIds": group_ids}


def check_s3_uri(uri: str | None, option: str) -> str:
    """Return ``uri`` without a trailing slash, or raise if it is not ``s3://bucket[/key]``."""
    if not uri or not re.fullmatch(r"s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?", uri):
        raise SubmitError(f"{option} {uri!r} must be an S3 URI like s3://my-bucket/prefix")
    return uri.rstrip("/")
