"""``hetero submit``: build, check and submit SageMaker training jobs with boto3.

(The SageMaker Python SDK, when installed, only names the ``--framework-version`` image; for an
SDK ``ModelTrainer`` see ``hetero.sagemaker.sdk``.)

Heterogeneous: ``--data-group TYPE:COUNT --dnn-group TYPE:COUNT [--group NAME=TYPE:COUNT]``.
Homogeneous: ``--instance TYPE:COUNT``. Both (the benchmark pair): the groups plus ``--pair``
(and optionally ``--instance``; default: the dnn group's type and count).
Extra data nodes for a running job: ``--join JOB [--data-group TYPE:COUNT]`` (a data-only job
made from the running one; see docs/elastic.md).
"""
from __future__ import annotations

import argparse
import json
import sys


def register(sub) -> None:
    """Add the ``submit`` parser to ``sub``."""
    from hetero.commands import RawHelpFormatter, plain
    from hetero.commands.submit_spec import add_job_options

    p = sub.add_parser("submit", help="submit a SageMaker training job (hetero, homogeneous or both)",
                       description=plain(__doc__), formatter_class=RawHelpFormatter)
    c = p.add_argument_group("cluster")
    c.add_argument("--data-group", metavar="TYPE:COUNT", help="CPU data-node group, e.g. ml.c5.9xlarge:1")
    c.add_argument("--dnn-group", metavar="TYPE:COUNT", help="GPU training group, e.g. ml.p3.2xlarge:1")
    c.add_argument("--data-group-name", default="data_group", help="name of the data group (default data_group)")
    c.add_argument("--dnn-group-name", default="dnn_group", help="name of the dnn group (default dnn_group)")
    c.add_argument("--group", action="append", default=[], metavar="[dnn:]NAME=TYPE:COUNT",
                   help="extra instance group, a data group unless prefixed dnn: (repeatable; at most 5 groups)")
    c.add_argument("--instance", metavar="TYPE:COUNT", help="homogeneous job (or, with --pair, its partner)")
    c.add_argument("--pair", action="store_true", help="submit the heterogeneous job and its homogeneous twin")
    c.add_argument("--join", metavar="JOB_NAME",
                   help="a data-only job whose data nodes join the running job JOB_NAME (same image, code, pipeline, "
                        "secret and VPC, read with DescribeTrainingJob; default group: 1 node of its data type)")
    j = p.add_argument_group("job")
    j.add_argument("--job-name", help="training job name (default hetero-<kind>-<time>; a pair adds -het/-hom)")
    j.add_argument("--input", action="append", default=[], metavar="[NAME=]S3URI[@GROUP]",
                   help="input channel (repeatable; default name 'train'; @GROUP[+GROUP] sends it to those groups)")
    j.add_argument("--input-mode", action="append", default=[], metavar="[NAME=]File|FastFile",
                   help="how channels reach the nodes: File copies first (default), FastFile streams from S3; "
                        "MODE sets every channel, NAME=MODE one (repeatable)")
    j.add_argument("--shards", metavar="S3URI",
                   help="train on `hetero prepare`'s shards read straight from S3 by the data nodes (no channel; "
                        "the job's role needs s3:GetObject and s3:ListBucket there): sets pipeline.shards and, "
                        "unless --hyperparameters names a pipeline, the image pipeline, model and step")
    j.add_argument("--output", help="S3 URI for job outputs (model.tar.gz, output.tar.gz)")
    j.add_argument("--registry", nargs="?", const="default", metavar="S3URI",
                   help="registry of the job's data servers, which other data servers may join (hetero submit "
                        "--join, hetero serve --join): an S3 prefix, or alone for <output>/<job>/registry")
    j.add_argument("--hyperparameters", nargs="+", action="extend", default=[], metavar="K=V",
                   help="the job's hyperparameters: the pipeline and its options, the model, epochs, seed, ...")
    j.add_argument("--env", action="append", default=[], metavar="K=V", help="container environment variable")
    j.add_argument("--spot", action="store_true", help="managed spot training (checkpoints under --output)")
    j.add_argument("--max-wait", help="spot: max time including waiting for capacity (default max-run + 1h)")
    j.add_argument("--checkpoint", metavar="S3URI", help="checkpoint S3 URI (spot default: <output>/<job>/checkpoints)")
    r = p.add_argument_group("run")
    r.add_argument("--dry-run", action="store_true",
                   help="print the CreateTrainingJob request(s) as JSON; no AWS call (with --join: only "
                        "DescribeTrainingJob of the running job)")
    r.add_argument("--wait", action="store_true", help="follow the job(s), stream logs, print step time and cost")
    r.add_argument("--wait-timeout", type=float, default=None, help="deadline for --wait in s (default max run + 1h)")
    r.add_argument("--poll", type=float, default=30.0, help="seconds between status polls")
    r.add_argument("--no-logs", action="store_true", help="with --wait: do not stream CloudWatch logs")
    r.add_argument("--prices", default=None, help="price file override (default $HETERO_PRICES)")
    add_job_options(p.add_argument_group("job, as for hetero sweep"), "the job")
    p.set_defaults(func=run)


IMAGE_PIPELINE = "data_service.pipelines.images:build_pipeline"
IMAGE_MODEL = "examples.imagefolder"  # ResNet-18 and its step: user code, by import path


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


def advice_prices(types: list[str], prices: str | None = None) -> dict[str, str]:
    """The ``advice_prices`` hyperparameter (instance type -> $/h) for the live advice's costs,
    from the price table; empty when no type has a price."""
    from hetero.planning.cost import load_prices
    from launcher.capacity import PlanError

    try:
        table = load_prices(prices)
    except PlanError as exc:
        print(f"hetero submit: no prices for the live advice ({exc})", file=sys.stderr)
        return {}
    known = {t: table.hourly(t) for t in dict.fromkeys(types) if t in table.entries}
    return {"advice_prices": json.dumps(known, sort_keys=True)} if known else {}


def advice_network(types: list[str], prices: str | None = None) -> dict[str, str]:
    """The ``advice_network`` hyperparameter (instance type -> NIC baseline Gbps) for the live advice's
    network model, from the instance table; empty when no type has a figure."""
    from hetero.planning.cost import load_prices
    from launcher.capacity import PlanError

    try:
        table = load_prices(prices)
    except PlanError:
        return {}  # advice_prices already said why
    known = {t: table.info(t).baseline_gbps for t in dict.fromkeys(types)
             if t in table.entries and table.info(t).baseline_gbps}
    return {"advice_network": json.dumps(known, sort_keys=True)} if known else {}


def join_specs(args: argparse.Namespace, clients) -> list:
    """The data-only JobSpec that joins the running job ``args.join`` (reads it from AWS)."""
    from hetero.sagemaker.join import default_join_name, describe, join_spec
    from hetero.sagemaker.spec import (DATA, Group, SubmitError, check_s3_uri, parse_duration, parse_strings,
                                       parse_type_count, parse_vpc)

    if args.dnn_group or args.instance or args.pair or args.group or args.input or args.shards or args.registry:
        raise SubmitError("--join makes a data-only job from the running one: give only --data-group (and job "
                          "options), not --dnn-group, --group, --instance, --pair, --input, --shards or --registry")
    if args.job_secret or args.job_secret_arn:
        raise SubmitError("--join uses the running job's secret (its token must match): drop --job-secret / "
                          "--job-secret-arn")
    group = Group(args.data_group_name, *parse_type_count(args.data_group, "--data-group"), DATA) \
        if args.data_group else None
    vpc = parse_vpc(args.subnet, args.security_group)
    hps = parse_strings(args.hyperparameters, "--hyperparameters")
    output = check_s3_uri(args.output, "--output") if args.output else None
    if args.image and args.framework_version:
        raise SubmitError("give --image or --framework-version, not both")
    image = args.image
    if args.framework_version:
        from hetero.sagemaker.images import training_image

        image, _ = training_image(args.framework_version, clients.region, [group.instance_type] if group else [])
    job = describe(clients, args.join)
    return [join_spec(job, job_name=args.job_name or default_join_name(args.join), group=group, vpc=vpc,
                      role=args.role if args.role else None, image=image, output=output, region=clients.region,
                      max_run_s=parse_duration(args.max_run, "--max-run"), spot=args.spot,
                      hyperparameters=hps, tags=parse_strings(args.tag, "--tag"))]


def specs_from_args(args: argparse.Namespace) -> list:
    """The JobSpec(s) the options describe; raises SubmitError before any AWS call."""
    from hetero.sagemaker.client import resolve_region
    from hetero.sagemaker.request import default_job_name
    from hetero.sagemaker.spec import SubmitError, check_s3_uri, parse_strings

    from .submit_spec import ROLE_ENV, cluster_of, image_of, job_secrets, job_spec, with_secret

    groups, instance = cluster_of(args)
    if not args.role:
        raise SubmitError(f"missing role: pass --role arn:aws:iam::ACCOUNT:role/NAME (the SageMaker execution "
                          f"role) or set ${ROLE_ENV}")
    output = check_s3_uri(args.output, "--output")
    region = resolve_region(args.region)
    image = image_of(args, region, groups, instance)
    hps = parse_strings(args.hyperparameters, "--hyperparameters")
    if args.shards:
        hps = direct_shards(hps, check_s3_uri(args.shards, "--shards"))
    env = parse_strings(args.env, "--env")
    secret, secret_arn = job_secrets(args, hps, env)
    name = args.job_name or default_job_name("pair" if args.pair else ("het" if groups else "hom"))
    _add_job_hyperparameters(args, hps, groups, output, name)
    spec = job_spec(args, name, image, region, output, groups, instance, hps, env)
    return with_secret(spec, args.pair, instance, secret, secret_arn)


def _add_job_hyperparameters(args: argparse.Namespace, hps: dict, groups: list, output: str, name: str) -> None:
    """Add to ``hps`` the registry the options ask for and, unless set, the live advice's prices and NIC figures."""
    from hetero.sagemaker.spec import check_s3_uri

    if args.registry:
        hps["registry"] = (f"{output}/{name}/registry" if args.registry == "default"
                           else check_s3_uri(args.registry, "--registry"))
    if groups and "advice_prices" not in hps:
        hps.update(advice_prices([g.instance_type for g in groups], args.prices))
    if groups and "advice_network" not in hps:
        hps.update(advice_network([g.instance_type for g in groups], args.prices))


def run(args: argparse.Namespace) -> int:
    """Check, then print (--dry-run) or submit the job(s); with --wait follow them and report."""
    from hetero.sagemaker.client import Clients, exit_status, prepare
    from hetero.sagemaker.request import masked, secret_notice
    from hetero.sagemaker.spec import SubmitError

    clients = None
    try:
        if args.join:
            from botocore.exceptions import BotoCoreError, ClientError

            from hetero.sagemaker.client import resolve_region

            clients = Clients(resolve_region(args.region), args.endpoint_url)
            try:
                specs = join_specs(args, clients)
            except (BotoCoreError, ClientError) as exc:
                print(f"hetero submit: cannot read training job {args.join!r} (DescribeTrainingJob in "
                      f"{clients.region}): {exc}; check the name, the region and that you may call "
                      "sagemaker:DescribeTrainingJob", file=sys.stderr)
                return 1
        else:
            specs = specs_from_args(args)
        requests = prepare(specs)
    except SubmitError as exc:
        print(f"hetero submit: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        shown = [masked(request) for request in requests]
        print(json.dumps(shown[0] if len(shown) == 1 else shown, indent=2, sort_keys=False))
        for spec in specs:
            print(f"hetero submit: {spec.job_name}: {secret_notice(spec)}", file=sys.stderr)
        return 0
    from launcher.log_setup import setup_logging

    setup_logging("submit", args.log_level)
    clients = clients or Clients(specs[0].region, args.endpoint_url)
    return exit_status("hetero submit", lambda: _send(args, specs, clients), (SubmitError,))


def _send(args: argparse.Namespace, specs: list, clients) -> int:
    from hetero.sagemaker.client import submit
    from hetero.sagemaker.request import secret_notice

    arns = submit(specs, clients, args.source_dir)
    for spec, arn in zip(specs, arns):
        print(f"submitted {spec.job_name}: {arn}", flush=True)
        print(f"hetero submit: {spec.job_name}: {secret_notice(spec)}", file=sys.stderr)
    return _follow(args, specs, clients) if args.wait else 0


def _follow(args: argparse.Namespace, specs: list, clients) -> int:
    from hetero.sagemaker.follow import WaitTimeout
    from hetero.sagemaker.report import follow_jobs, report_lines

    longest = max((s.max_wait_s or s.max_run_s + 3600) if s.spot else s.max_run_s for s in specs)
    timeout = args.wait_timeout if args.wait_timeout is not None else longest + 3600
    on_log = None if args.no_logs else (lambda line: print(line, flush=True))
    try:
        summaries = follow_jobs(clients, [s.job_name for s in specs], timeout, args.poll, on_log, args.prices)
    except WaitTimeout as exc:
        print(f"hetero submit: {exc}", file=sys.stderr)
        return 3
    for line in report_lines(summaries):
        print(line)
    return 0 if all(s["status"] == "Completed" for s in summaries) else 1
