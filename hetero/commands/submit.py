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
import os
import sys


def register(sub) -> None:
    """Add the ``submit`` parser to ``sub``."""
    from hetero.commands import add_command

    p = add_command(sub, "submit", "submit a SageMaker training job (hetero, homogeneous or both)", __doc__, raw=True)
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


def add_job_options(p, every: str) -> None:
    """The options every SageMaker job takes, declared once for ``hetero submit`` and ``hetero sweep``:
    role, image, network, limits, job secret, code upload, tags, the AWS endpoint. ``every``: whose
    they are in the help ("the job", "every job")."""
    from hetero.sagemaker.jobs import ROLE_ENV

    p.add_argument("--role", default=os.environ.get(ROLE_ENV), help=f"SageMaker execution role ARN of {every} "
                   f"(default ${ROLE_ENV})")
    p.add_argument("--image", help=f"training image URI of {every} (one image for every group)")
    p.add_argument("--framework-version",
                   help="the AWS PyTorch training image of this version, e.g. 2.5: its CPU flavour for a job on CPU "
                        "instances only, else its GPU flavour")
    p.add_argument("--subnet", action="append", default=[], metavar="ID",
                   help=f"VpcConfig subnet of {every} (repeatable or comma-separated; with --security-group)")
    p.add_argument("--security-group", action="append", default=[], metavar="ID",
                   help=f"VpcConfig security group of {every} (repeatable or comma-separated; with --subnet)")
    p.add_argument("--max-run", default="24h", help=f"max training time of {every}: seconds or 90m, 2h, 1d")
    p.add_argument("--volume-size", type=int, default=30, help="EBS GB per instance")
    p.add_argument("--job-secret", default=None,
                   help=f"secret for the job token, sent in clear as HETERO_JOB_SECRET to {every} (default: random; "
                        "readable by anyone allowed sagemaker:DescribeTrainingJob)")
    p.add_argument("--job-secret-arn", default=None, metavar="ARN",
                   help="AWS Secrets Manager secret holding the job secret: each node reads it at start, the "
                        "request carries only the ARN (the role needs secretsmanager:GetSecretValue)")
    p.add_argument("--source-dir", default=None, help="checkout to upload as sourcedir.tar.gz (default: this one)")
    p.add_argument("--code-uri", metavar="S3URI", help="S3 prefix for sourcedir.tar.gz (default: --output)")
    p.add_argument("--no-source", action="store_true", help="upload no code: the image holds it")
    p.add_argument("--tag", action="append", default=[], metavar="K=V", help=f"resource tag of {every}")
    p.add_argument("--region", default=None, help="AWS region (default from the AWS config/env)")
    p.add_argument("--endpoint-url", default=None, help="send AWS calls there (e.g. a moto server)")


def run(args: argparse.Namespace) -> int:
    """Check, then print (--dry-run) or submit the job(s); with --wait follow them and report."""
    from hetero.sagemaker.client import Clients, exit_status, prepare
    from hetero.sagemaker.jobs import SubmitOptions, join_specs, submit_specs
    from hetero.sagemaker.request import masked, secret_notice
    from hetero.sagemaker.spec import SubmitError

    clients = None
    try:
        if args.join:
            from botocore.exceptions import BotoCoreError, ClientError

            from hetero.sagemaker.client import resolve_region

            clients = Clients(resolve_region(args.region), args.endpoint_url)
            try:
                specs = join_specs(SubmitOptions.of(args), clients)
            except (BotoCoreError, ClientError) as exc:
                print(f"hetero submit: cannot read training job {args.join!r} (DescribeTrainingJob in "
                      f"{clients.region}): {exc}; check the name, the region and that you may call "
                      "sagemaker:DescribeTrainingJob", file=sys.stderr)
                return 1
        else:
            specs = submit_specs(SubmitOptions.of(args))
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
