"""The jobs ``hetero submit`` and ``hetero sweep`` describe: their options as one typed value each
(one field per option) in, the JobSpecs out, checked before any AWS call (``SubmitError``).

``submit_specs`` adds the hyperparameters the command adds itself (shards, registry, the live
advice's prices and NIC figures); ``join_specs`` reads the running job it joins from AWS.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, fields
from typing import Self, cast

from hetero.sagemaker.client import resolve_region
from hetero.sagemaker.images import training_image
from hetero.sagemaker.join import default_join_name, describe, join_spec
from hetero.sagemaker.request import default_job_name, make_pair
from hetero.sagemaker.source import source_uri
from hetero.sagemaker.spec import (DATA, DNN, SECRET_ARN_ENV, SECRET_ENV, SECRET_HP, Group, JobSpec, SubmitError,
                                   apply_input_modes, check_s3_uri, check_secret_arn, parse_duration, parse_group,
                                   parse_input, parse_strings, parse_type_count, parse_vpc)
from hetero.sagemaker.sweep import Sweep, grid, sweep_specs

ROLE_ENV = "HETERO_SAGEMAKER_ROLE"
IMAGE_PIPELINE = "data_service.pipelines.images:build_pipeline"
IMAGE_MODEL = "examples.imagefolder"  # ResNet-18 and its step: user code, by import path


@dataclass(frozen=True)
class JobOptions:
    """The options every SageMaker job takes (``hetero.commands.submit.add_job_options``, and those
    ``hetero submit`` and ``hetero sweep`` each declare alike), as parsed."""

    role: str | None
    image: str | None
    framework_version: str | None
    subnet: list[str]
    security_group: list[str]
    max_run: str
    volume_size: int
    job_secret: str | None
    job_secret_arn: str | None
    code_uri: str | None
    no_source: bool
    tag: list[str]
    region: str | None
    hyperparameters: list[str]
    input: list[str]
    registry: str | None
    spot: bool

    @classmethod
    def of(cls, args: object) -> Self:
        """The options of this type that ``args`` (an argparse namespace) holds."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class SubmitOptions(JobOptions):
    """``hetero submit``'s options, as parsed."""

    data_group: str | None
    dnn_group: str | None
    data_group_name: str
    dnn_group_name: str
    group: list[str]
    instance: str | None
    pair: bool
    join: str | None
    job_name: str | None
    input_mode: list[str]
    shards: str | None
    output: str | None
    env: list[str]
    max_wait: str | None
    checkpoint: str | None
    prices: str | None


@dataclass(frozen=True)
class SweepOptions(JobOptions):
    """``hetero sweep``'s options, as parsed."""

    job_name: str
    data_group: str
    dnn_group: str
    jobs: int
    vary: list[str]
    job: list[str]
    batch_window: str
    idle_timeout: float
    output: str


def cluster_of(o: SubmitOptions) -> tuple[list[Group], tuple[str, int] | None]:
    """(the instance groups, ``--instance`` as (type, count) or None), checked against each other and ``--pair``."""
    groups = []
    if o.data_group:
        groups.append(Group(o.data_group_name, *parse_type_count(o.data_group, "--data-group"), DATA))
    if o.dnn_group:
        groups.append(Group(o.dnn_group_name, *parse_type_count(o.dnn_group, "--dnn-group"), DNN))
    groups += [parse_group(text) for text in o.group]
    instance = parse_type_count(o.instance, "--instance") if o.instance else None
    if not groups and not instance:
        raise SubmitError("no cluster: give --data-group and --dnn-group (heterogeneous), --instance "
                          "(homogeneous), or the groups plus --pair for both")
    if o.pair and not groups:
        raise SubmitError("--pair needs the heterogeneous groups (--data-group/--dnn-group/--group)")
    if groups and instance and not o.pair:
        raise SubmitError("--instance together with instance groups: add --pair to submit both jobs, "
                          "or drop one of them")
    return groups, instance


def image_of(o: JobOptions, region: str, types: list[str], command: str = "hetero submit") -> str:
    """``--image``, or the AWS PyTorch training image of ``--framework-version`` for instance ``types``
    (said on stderr, prefixed with ``command``)."""
    if o.image and o.framework_version:
        raise SubmitError("give --image or --framework-version, not both")
    if o.image:
        return o.image
    if not o.framework_version:
        raise SubmitError("no training image: pass --image URI (e.g. our data/dnn image in ECR) or "
                          "--framework-version 2.5 for the AWS PyTorch training image")
    image, source = training_image(o.framework_version, region, types)
    print(f"{command}: training image {image} (from the {source})", file=sys.stderr)
    return image


def job_secrets(o: JobOptions, hps: dict, env: dict) -> tuple[str | None, str | None]:
    """(the job secret, the Secrets Manager ARN holding it): from their options, else taken out of
    ``hps`` and ``env`` so that the request carries them only where SageMaker expects them."""
    secret = o.job_secret or hps.pop(SECRET_HP, None) or env.pop(SECRET_ENV, None)
    secret_arn = o.job_secret_arn or env.pop(SECRET_ARN_ENV, None)
    if secret and secret_arn:
        raise SubmitError("give --job-secret or --job-secret-arn, not both (the ARN keeps the secret out of "
                          "the request)")
    return secret, secret_arn


def with_secret(spec: JobSpec, secret: str | None, secret_arn: str | None) -> JobSpec:
    """``spec``, carrying the job secret or its ARN."""
    if secret:
        spec.job_secret = secret
    if secret_arn:
        spec.job_secret_arn = check_secret_arn(secret_arn)
    return spec


def _source(o: JobOptions, output: str, name: str) -> str | None:
    """Where the job's sourcedir.tar.gz goes (None: the image holds the code)."""
    return None if o.no_source else source_uri(check_s3_uri(o.code_uri, "--code-uri") if o.code_uri else output, name)


def direct_shards(hps: dict, uri: str) -> dict:
    """Hyperparameters that make the data nodes read shards at ``uri`` themselves (no channel)."""
    hps = dict(hps)
    if "pipeline" not in hps:  # the image job: pipeline, model and step read the same shards
        hps.update({"pipeline": IMAGE_PIPELINE, "model": f"{IMAGE_MODEL}:resnet18",
                    "step": f"{IMAGE_MODEL}:train_step", "model.shards": uri, **hps})
    hps["pipeline.shards"] = uri
    print(f"hetero submit: data: shards under {uri}, read directly by the data nodes with the job's role "
          "(no channel: the role needs s3:GetObject and s3:ListBucket on that prefix)", file=sys.stderr)
    return hps


def add_advice_figures(hps: dict, types: list[str], prices: str | None = None) -> None:
    """Add to ``hps``, unless set, the live advice's ``advice_prices`` (instance type -> $/h, for its
    costs) and ``advice_network`` (instance type -> NIC baseline Gbps, for its network model), from
    the price table; each left out when no type has a figure."""
    from hetero.planning.cost import load_prices
    from launcher.capacity import PlanError

    if "advice_prices" in hps and "advice_network" in hps:
        return
    try:
        table = load_prices(prices)
    except PlanError as exc:
        if "advice_prices" not in hps:
            print(f"hetero submit: no prices for the live advice ({exc})", file=sys.stderr)
        return
    known = [t for t in dict.fromkeys(types) if t in table.entries]
    figures = {"advice_prices": {t: table.hourly(t) for t in known},
               "advice_network": {t: table.info(t).baseline_gbps for t in known if table.info(t).baseline_gbps}}
    hps.update({k: json.dumps(v, sort_keys=True) for k, v in figures.items() if v and k not in hps})


def submit_specs(o: SubmitOptions) -> list[JobSpec]:
    """The JobSpec(s) of ``hetero submit`` without ``--join``: one job, or with ``--pair`` the
    heterogeneous one and its homogeneous twin."""
    groups, instance = cluster_of(o)
    if not o.role:
        raise SubmitError(f"missing role: pass --role arn:aws:iam::ACCOUNT:role/NAME (the SageMaker execution "
                          f"role) or set ${ROLE_ENV}")
    output = check_s3_uri(o.output, "--output")
    region = resolve_region(o.region)
    image = image_of(o, region, [g.instance_type for g in groups] + ([instance[0]] if instance else []))
    hps = parse_strings(o.hyperparameters, "--hyperparameters")
    if o.shards:
        hps = direct_shards(hps, check_s3_uri(o.shards, "--shards"))
    env = parse_strings(o.env, "--env")
    secret, secret_arn = job_secrets(o, hps, env)
    name = o.job_name or default_job_name("pair" if o.pair else ("het" if groups else "hom"))
    if o.registry:
        hps["registry"] = (f"{output}/{name}/registry" if o.registry == "default"
                           else check_s3_uri(o.registry, "--registry"))
    if groups:
        add_advice_figures(hps, [g.instance_type for g in groups], o.prices)
    if o.volume_size < 1:
        raise SubmitError(f"--volume-size {o.volume_size}: give at least 1 (GB)")
    spec = with_secret(JobSpec(
        job_name=name, role=o.role, image=image, region=region, output=output,
        # cluster_of gives an --instance whenever there are no groups
        groups=groups or [Group("homogeneousCluster", *cast("tuple[str, int]", instance))], homogeneous=not groups,
        channels=apply_input_modes([parse_input(text) for text in o.input], o.input_mode),
        hyperparameters=hps,
        max_run_s=parse_duration(o.max_run, "--max-run"), spot=o.spot,
        max_wait_s=parse_duration(o.max_wait, "--max-wait") if o.max_wait else None,
        checkpoint_s3=check_s3_uri(o.checkpoint, "--checkpoint") if o.checkpoint else None,
        volume_gb=o.volume_size, source_s3=_source(o, output, name), environment=env,
        tags={"hetero:mode": "heterogeneous" if groups else "homogeneous", **parse_strings(o.tag, "--tag")},
        vpc=parse_vpc(o.subnet, o.security_group)), secret, secret_arn)
    if not o.pair:
        return [spec]
    het, hom = make_pair(spec, instance)
    return [het, with_secret(hom, secret, None)]


def join_specs(o: SubmitOptions, clients) -> list[JobSpec]:
    """The data-only JobSpec that joins the running job ``o.join`` (read from AWS with ``clients``)."""
    assert o.join
    if o.dnn_group or o.instance or o.pair or o.group or o.input or o.shards or o.registry:
        raise SubmitError("--join makes a data-only job from the running one: give only --data-group (and job "
                          "options), not --dnn-group, --group, --instance, --pair, --input, --shards or --registry")
    if o.job_secret or o.job_secret_arn:
        raise SubmitError("--join uses the running job's secret (its token must match): drop --job-secret / "
                          "--job-secret-arn")
    group = Group(o.data_group_name, *parse_type_count(o.data_group, "--data-group"), DATA) if o.data_group else None
    vpc = parse_vpc(o.subnet, o.security_group)
    hps = parse_strings(o.hyperparameters, "--hyperparameters")
    output = check_s3_uri(o.output, "--output") if o.output else None
    if o.image and o.framework_version:
        raise SubmitError("give --image or --framework-version, not both")
    image = o.image
    if o.framework_version:
        image, _ = training_image(o.framework_version, clients.region, [group.instance_type] if group else [])
    job = describe(clients, o.join)
    return [join_spec(job, job_name=o.job_name or default_join_name(o.join), group=group, vpc=vpc,
                      role=o.role, image=image, output=output, region=clients.region,
                      max_run_s=parse_duration(o.max_run, "--max-run"), spot=o.spot,
                      hyperparameters=hps, tags=parse_strings(o.tag, "--tag"))]


def sweep_job_specs(o: SweepOptions) -> list[JobSpec]:
    """The sweep's JobSpecs: its data-only job, then one DNN-only job per entry of its grid or ``--job``."""
    from data_service.errors import ConfigError
    from data_service.server.batch_window import window_budget

    if not o.role:
        raise SubmitError(f"missing role: pass --role arn:aws:iam::ACCOUNT:role/NAME or set ${ROLE_ENV}")
    try:
        window = window_budget(o.batch_window)  # parsed once, here: bytes from now on
    except ConfigError as exc:
        raise SubmitError(f"--batch-window: {exc}") from None
    if o.job and (o.vary or o.jobs):
        raise SubmitError("give the jobs one way: --job (repeatable), or --vary / --jobs")
    own = [parse_strings(j.split(","), "--job") for j in o.job] or grid(o.vary, o.jobs)
    output = check_s3_uri(o.output, "--output")
    region = resolve_region(o.region)
    data = Group("data_group", *parse_type_count(o.data_group, "--data-group"), DATA)
    dnn = Group("dnn_group", *parse_type_count(o.dnn_group, "--dnn-group"), DNN)
    # each job its own image: the data-only job's CPU nodes get the CPU flavour of --framework-version
    data_image = image_of(o, region, [data.instance_type], command="hetero sweep: data job")
    image = image_of(o, region, [dnn.instance_type], command="hetero sweep: DNN jobs")
    hps = parse_strings(o.hyperparameters, "--hyperparameters")
    secret, secret_arn = job_secrets(o, hps, {})
    registry = check_s3_uri(o.registry, "--registry") if o.registry else f"{output}/{o.job_name}/registry"
    base = with_secret(JobSpec(job_name=o.job_name, role=o.role, image=image, groups=[dnn], output=output,
                               region=region, channels=[parse_input(text) for text in o.input], hyperparameters=hps,
                               max_run_s=parse_duration(o.max_run, "--max-run"), volume_gb=o.volume_size,
                               source_s3=_source(o, output, o.job_name), tags=parse_strings(o.tag, "--tag"),
                               vpc=parse_vpc(o.subnet, o.security_group)), secret, secret_arn)
    sweep = Sweep(o.job_name, registry, window, o.idle_timeout, tuple(tuple(sorted(j.items())) for j in own))
    specs = sweep_specs(base, data, dnn, sweep, data_image=data_image)
    for spec in specs[1:]:
        spec.spot = o.spot  # the data job serves the whole sweep: no spot interruption for it
    if len({dict(j).get("seed", hps.get("seed")) for j in sweep.jobs}) > 1:
        print("hetero sweep: the jobs have different seeds: they share decoded images (decoded_cache_bytes), "
              "not batches (docs/sweep.md)", file=sys.stderr)
    return specs
