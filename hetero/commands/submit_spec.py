"""The job ``hetero submit``'s options describe: cluster, image, job secret and the JobSpec(s), checked
before any AWS call.

:func:`hetero.commands.submit.specs_from_args` puts these together with the hyperparameters the
command adds itself (shards, registry, the live advice's prices and NIC figures).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import cast

ROLE_ENV = "HETERO_SAGEMAKER_ROLE"


def add_job_options(p, every: str) -> None:
    """The options every SageMaker job takes, declared once for ``hetero submit`` and ``hetero sweep``:
    role, image, network, limits, job secret, code upload, tags, the AWS endpoint. ``every``: whose
    they are in the help ("the job", "every job")."""
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


def cluster_of(args: argparse.Namespace) -> tuple[list, tuple[str, int] | None]:
    """(the instance groups, ``--instance`` as (type, count) or None), checked against each other and ``--pair``."""
    from hetero.sagemaker.spec import DATA, DNN, Group, SubmitError, parse_group, parse_type_count

    groups = []
    if args.data_group:
        groups.append(Group(args.data_group_name, *parse_type_count(args.data_group, "--data-group"), DATA))
    if args.dnn_group:
        groups.append(Group(args.dnn_group_name, *parse_type_count(args.dnn_group, "--dnn-group"), DNN))
    groups += [parse_group(text) for text in args.group]
    instance = parse_type_count(args.instance, "--instance") if args.instance else None
    if not groups and not instance:
        raise SubmitError("no cluster: give --data-group and --dnn-group (heterogeneous), --instance "
                          "(homogeneous), or the groups plus --pair for both")
    if args.pair and not groups:
        raise SubmitError("--pair needs the heterogeneous groups (--data-group/--dnn-group/--group)")
    if groups and instance and not args.pair:
        raise SubmitError("--instance together with instance groups: add --pair to submit both jobs, "
                          "or drop one of them")
    return groups, instance


def image_of(args: argparse.Namespace, region: str, groups: list, instance: tuple[str, int] | None,
             command: str = "hetero submit") -> str:
    """``--image``, or the AWS PyTorch training image of ``--framework-version`` for the job's instance types
    (said on stderr, prefixed with ``command``)."""
    from hetero.sagemaker.images import training_image
    from hetero.sagemaker.spec import SubmitError

    if args.image and args.framework_version:
        raise SubmitError("give --image or --framework-version, not both")
    if not args.image and not args.framework_version:
        raise SubmitError("no training image: pass --image URI (e.g. our data/dnn image in ECR) or "
                          "--framework-version 2.5 for the AWS PyTorch training image")
    if args.image:
        return args.image
    types = [g.instance_type for g in groups] + ([instance[0]] if instance else [])
    image, source = training_image(args.framework_version, region, types)
    print(f"{command}: training image {image} (from the {source})", file=sys.stderr)
    return image


def job_secrets(args: argparse.Namespace, hps: dict, env: dict) -> tuple[str | None, str | None]:
    """(the job secret, the Secrets Manager ARN holding it): from their options, else taken out of
    ``hps`` and ``env`` so that the request carries them only where SageMaker expects them."""
    from hetero.sagemaker.spec import SECRET_ARN_ENV, SECRET_ENV, SECRET_HP, SubmitError

    secret = args.job_secret or hps.pop(SECRET_HP, None) or env.pop(SECRET_ENV, None)
    secret_arn = args.job_secret_arn or env.pop(SECRET_ARN_ENV, None)
    if secret and secret_arn:
        raise SubmitError("give --job-secret or --job-secret-arn, not both (the ARN keeps the secret out of "
                          "the request)")
    return secret, secret_arn


def job_spec(args: argparse.Namespace, name: str, image: str, region: str, output: str, groups: list,
             instance: tuple[str, int] | None, hps: dict, env: dict):
    """The JobSpec of the job the options describe (of a pair, the heterogeneous one), without its secret."""
    from hetero.sagemaker.source import source_uri
    from hetero.sagemaker.spec import (Group, JobSpec, SubmitError, apply_input_modes, check_s3_uri, parse_duration,
                                       parse_input, parse_strings, parse_vpc)

    if args.volume_size < 1:
        raise SubmitError(f"--volume-size {args.volume_size}: give at least 1 (GB)")
    return JobSpec(
        job_name=name, role=args.role, image=image, region=region, output=output,
        # cluster_of gives an --instance whenever there are no groups
        groups=groups or [Group("homogeneousCluster", *cast("tuple[str, int]", instance))], homogeneous=not groups,
        channels=apply_input_modes([parse_input(text) for text in args.input], args.input_mode),
        hyperparameters=hps,
        max_run_s=parse_duration(args.max_run, "--max-run"), spot=args.spot,
        max_wait_s=parse_duration(args.max_wait, "--max-wait") if args.max_wait else None,
        checkpoint_s3=check_s3_uri(args.checkpoint, "--checkpoint") if args.checkpoint else None,
        volume_gb=args.volume_size,
        source_s3=None if args.no_source else source_uri(
            check_s3_uri(args.code_uri, "--code-uri") if args.code_uri else output, name),
        environment=env,
        tags={"hetero:mode": "heterogeneous" if groups else "homogeneous", **parse_strings(args.tag, "--tag")},
        vpc=parse_vpc(args.subnet, args.security_group))


def with_secret(spec, pair: bool, instance: tuple[str, int] | None, secret: str | None,
                secret_arn: str | None) -> list:
    """``[spec]``, or with ``pair`` the spec and its homogeneous twin, carrying the job secret or its ARN."""
    from hetero.sagemaker.request import make_pair
    from hetero.sagemaker.spec import check_secret_arn

    if secret:
        spec.job_secret = secret
    if secret_arn:
        spec.job_secret_arn = check_secret_arn(secret_arn)
    if not pair:
        return [spec]
    specs = list(make_pair(spec, instance))
    if secret:
        specs[1].job_secret = secret
    return specs
