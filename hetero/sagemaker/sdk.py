"""A configured SageMaker Python SDK v3 ``ModelTrainer`` from the job description ``hetero submit`` uses.

For notebook users who stay in the SDK::

    from hetero.sagemaker import Channel, Group, JobSpec
    from hetero.sagemaker.sdk import model_trainer

    trainer = model_trainer(JobSpec(...))     # checked like `hetero submit` before anything is sent
    trainer.train(wait=False)

What it sets: ``Compute(instance_groups=...)`` (or instance type and count for a homogeneous
job), every channel as an ``S3DataSource`` with its instance groups and input mode, this
checkout's code (the same files as ``sourcedir.tar.gz``, with its ``requirements.txt``) as
``SourceCode`` with ``launcher/entry.py`` as the entry script, the launcher's hyperparameters,
the job secret (or its Secrets Manager ARN) as environment, the metric definitions,
TensorBoard output when ``tensorboard=true``, spot, checkpoints, tags, stopping condition.

Under ModelTrainer the SDK's own driver (``sm_drivers``) runs the entry script, not the
training toolkit of an AWS framework image: hyperparameters arrive as ``--key value``
arguments and no ``SM_CURRENT_INSTANCE_GROUP`` / ``SM_INSTANCE_GROUPS*`` variables are set;
the launcher reads the groups from ``resourceconfig.json`` and its options from the
arguments, so it runs the same. The SDK names the job ``<job_name>-<timestamp>``.
"""
from __future__ import annotations

import atexit
import io
import json
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from hetero.sagemaker.input_modes import check_input_modes
from hetero.sagemaker.request import TENSORBOARD_LOCAL, build_request, tensorboard_enabled
from hetero.sagemaker.sdk_version import sdk_problem
from hetero.sagemaker.source import build_sourcedir, split_s3
from hetero.sagemaker.spec import ENTRY_POINT, JobSpec, SubmitError
from hetero.sagemaker.validate import check_request

# Keys the sagemaker-training toolkit reads (script mode); the SDK's driver has its own.
_TOOLKIT_KEYS = ("sagemaker_program", "sagemaker_submit_directory", "sagemaker_region",
                 "sagemaker_container_log_level", "sagemaker_job_name")


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FOLDED = ("pipeline", "model")


def _json_or_text(value: str):
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError):
        return value


def sdk_hyperparameters(hps: dict[str, str]) -> dict[str, str]:
    """``hps`` in a form the SDK's driver can run.

    The driver's ``environment.py`` writes ``export SM_HP_<KEY>=...`` for every key into a file
    that ``sm_train.sh`` sources under ``set -e``, so a key that is not a shell name (the
    launcher's ``pipeline.batch_size`` form) stops the job before it starts. ``pipeline.X`` and
    ``model.X`` keys are folded into the ``pipeline_options`` / ``model_options`` JSON object the
    launcher reads the same way (a dotted key wins over the same key in the object, as in the
    launcher).

    Raises:
        SubmitError: another key that is not a shell name, or a folded object over 2500 chars.
    """
    out: dict[str, str] = {}
    folded: dict[str, dict] = {prefix: {} for prefix in _FOLDED}
    for key, value in hps.items():
        prefix, dot, sub = key.partition(".")
        if dot and prefix in folded and sub:
            folded[prefix][sub] = _json_or_text(value)
        elif _SHELL_NAME.fullmatch(key):
            out[key] = value
        else:
            raise SubmitError(f"hyperparameter {key!r} cannot pass through the SageMaker SDK's driver (it exports "
                              "SM_HP_<KEY> in a shell script); use letters, digits and underscores")
    for prefix, options in folded.items():
        if not options:
            continue
        name = f"{prefix}_options"
        base = _json_or_text(out.get(name, "{}"))
        if not isinstance(base, dict):
            raise SubmitError(f"hyperparameter {name}={out[name]!r} must be a JSON object")
        out[name] = json.dumps({**base, **options}, separators=(",", ":"))
        if len(out[name]) > 2500:
            raise SubmitError(f"{name} is {len(out[name])} chars once the {prefix}.* hyperparameters are folded "
                              "into it; SageMaker allows 2500: pass fewer options")
    return out


def stage_source(source_root: str | Path | None = None) -> Path:
    """This checkout's job code (the members of ``sourcedir.tar.gz``, requirements.txt included)
    unpacked in a fresh temporary folder, removed at interpreter exit; ModelTrainer uploads it."""
    data, _ = build_sourcedir(source_root)
    folder = Path(tempfile.mkdtemp(prefix="hetero-sdk-source-"))
    atexit.register(shutil.rmtree, folder, True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        try:
            tar.extractall(folder, filter="data")
        except TypeError:  # Python < 3.10.12 has no filter; the archive is the one just built here
            tar.extractall(folder)
    return folder


def _session(spec: JobSpec, boto_session=None):
    import boto3
    from sagemaker.core.helper.session_helper import Session

    # The SDK stages code under its default bucket; use the job's output bucket and prefix instead,
    # as `hetero submit` does, so one bucket policy covers the whole job.
    bucket, prefix = split_s3(spec.output)
    return Session(boto_session=boto_session or boto3.session.Session(region_name=spec.region),
                   default_bucket=bucket, default_bucket_prefix=prefix.strip("/") or None)


def model_trainer(spec: JobSpec, source_root: str | Path | None = None, sagemaker_session=None, boto_session=None):
    """A ``sagemaker.train.ModelTrainer`` that runs ``spec`` as ``hetero submit`` would.

    Args:
        spec: the job (``source_s3`` set: upload this checkout's code; None: the image holds it
            and runs the launcher itself).
        source_root: checkout whose code to upload (default: this one).
        sagemaker_session: a ``sagemaker.core.helper.session_helper.Session`` (default: one for
            ``spec.region`` staging code under ``spec.output``).
        boto_session: boto3 session for the default SageMaker session.

    Returns:
        The configured ModelTrainer; call ``.train(wait=False)`` to submit.

    Raises:
        SubmitError: no usable SDK (missing, v2, older than 3.18), a request SageMaker would
            reject (the same checks as ``hetero submit``), channels mixing group assignment,
            FastFile for a File-only pipeline. Nothing is sent.
    """
    problem = sdk_problem()  # names the installed version and the fix
    if problem is not None:
        raise SubmitError(problem)
    check_input_modes(spec)
    request = build_request(spec)
    check_request(request)  # also channels all assigned to groups or none (the SDK then gives its code all or none)

    from sagemaker.core import shapes
    from sagemaker.core.training.configs import (CheckpointConfig, Compute, Networking, OutputDataConfig, SourceCode,
                                                 StoppingCondition)
    from sagemaker.train import ModelTrainer

    cluster = ({"instance_type": spec.groups[0].instance_type, "instance_count": spec.groups[0].count}
               if spec.homogeneous else
               {"instance_groups": [shapes.InstanceGroup(instance_type=g.instance_type, instance_count=g.count,
                                                         instance_group_name=g.name) for g in spec.groups]})
    compute = Compute(**cluster, volume_size_in_gb=spec.volume_gb, enable_managed_spot_training=spec.spot or None)
    channels = [shapes.Channel(
        channel_name=c["ChannelName"], input_mode=c["InputMode"],
        data_source=shapes.DataSource(s3_data_source=shapes.S3DataSource(
            s3_data_type=c["DataSource"]["S3DataSource"]["S3DataType"], s3_uri=c["DataSource"]["S3DataSource"]["S3Uri"],
            s3_data_distribution_type=c["DataSource"]["S3DataSource"]["S3DataDistributionType"],
            instance_group_names=c["DataSource"]["S3DataSource"].get("InstanceGroupNames"))))
        for c in request.get("InputDataConfig", [])]
    stop = request["StoppingCondition"]
    source = (SourceCode(source_dir=str(stage_source(source_root)), entry_script=ENTRY_POINT,
                         requirements="requirements.txt") if spec.source_s3 else None)
    checkpoint = request.get("CheckpointConfig")
    trainer = ModelTrainer(
        sagemaker_session=sagemaker_session or _session(spec, boto_session), role=spec.role,
        base_job_name=spec.job_name, training_image=spec.image, compute=compute, source_code=source,
        input_data_config=channels or None,
        hyperparameters=sdk_hyperparameters({k: v for k, v in request["HyperParameters"].items()
                                             if k not in _TOOLKIT_KEYS}),
        environment=dict(request["Environment"]),
        output_data_config=OutputDataConfig(s3_output_path=spec.output),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=stop["MaxRuntimeInSeconds"],
                                             max_wait_time_in_seconds=stop.get("MaxWaitTimeInSeconds")),
        checkpoint_config=CheckpointConfig(s3_uri=checkpoint["S3Uri"], local_path=checkpoint["LocalPath"])
        if checkpoint else None,
        tags=[shapes.Tag(key=t["Key"], value=t["Value"]) for t in request.get("Tags", [])] or None,
        networking=Networking(subnets=spec.vpc["Subnets"], security_group_ids=spec.vpc["SecurityGroupIds"])
        if spec.vpc else None)
    trainer = trainer.with_metric_definitions(
        [shapes.MetricDefinition(name=d["Name"], regex=d["Regex"])
         for d in request["AlgorithmSpecification"]["MetricDefinitions"]])
    if tensorboard_enabled(spec):
        config = request["TensorBoardOutputConfig"]
        trainer = trainer.with_tensorboard_output_config(
            shapes.TensorBoardOutputConfig(s3_output_path=config["S3OutputPath"], local_path=TENSORBOARD_LOCAL))
    return trainer
