"""``hetero sweep``: one data-only SageMaker job serving N DNN-only jobs, each with its own hyperparameters.

    hetero sweep --job-name lr-sweep --data-group ml.c5.9xlarge:1 --dnn-group ml.g5.xlarge:1 \\
        --vary lr=0.1,0.03,0.01,0.003 --hyperparameters pipeline=... epochs=10 seed=1 \\
        --batch-window 8GB --idle-timeout 600 --subnet subnet-... --security-group sg-... \\
        --role ... --image ... --output s3://bucket/sweeps --input s3://bucket/train

The jobs of one seed share each batch the data group builds (its batch window); jobs with other
seeds share its decoded images when the pipeline keeps them (``decoded_cache_bytes``). Every
request is built and checked against botocore's service model before the first is sent; the
data job goes first. See docs/sweep.md (what AWS itself must confirm is listed there).
Exit codes: 0 submitted (or printed), 1 AWS refused a call, 2 bad input (nothing was sent).
"""
from __future__ import annotations

import argparse
import json
import sys


def register(sub) -> None:
    from hetero.commands import add_command
    from hetero.commands.submit import add_job_options

    p = add_command(sub, "sweep", "submit a sweep: one data-only job serving N DNN-only jobs", __doc__, raw=True)
    p.add_argument("--job-name", required=True, help="the sweep's name: jobs <name>-data, <name>-0, ... (the job "
                   "token is derived from it)")
    p.add_argument("--data-group", required=True, metavar="TYPE:COUNT", help="the data job's nodes")
    p.add_argument("--dnn-group", required=True, metavar="TYPE:COUNT", help="each DNN job's nodes")
    p.add_argument("--jobs", type=int, default=0, help="DNN jobs with no hyperparameters of their own")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="one DNN job per value (repeatable: every combination)")
    p.add_argument("--job", action="append", default=[], metavar="K=V[,K=V...]",
                   help="one DNN job with these hyperparameters of its own (repeatable; instead of --vary)")
    p.add_argument("--hyperparameters", nargs="+", action="extend", default=[], metavar="K=V",
                   help="every job's: the pipeline and its options, the model, epochs, seed, ...")
    p.add_argument("--batch-window", default="4GB", help="the data nodes' batch window (default 4GB; 0: off)")
    p.add_argument("--idle-timeout", type=float, default=600.0,
                   help="seconds the data job stays once the last DNN job has gone (default 600)")
    p.add_argument("--registry", metavar="S3URI", help="the sweep's registry (default <output>/<name>/registry)")
    p.add_argument("--output", required=True, help="S3 URI for the jobs' outputs")
    p.add_argument("--input", action="append", default=[], metavar="[NAME=]S3URI", help="the data job's channel")
    p.add_argument("--spot", action="store_true", help="managed spot training for the DNN jobs")
    p.add_argument("--dry-run", action="store_true", help="print the requests as JSON; no AWS call")
    add_job_options(p, "every job")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hetero.sagemaker.client import Clients, exit_status, prepare, submit
    from hetero.sagemaker.jobs import SweepOptions, sweep_job_specs
    from hetero.sagemaker.request import masked, secret_notice
    from hetero.sagemaker.spec import SubmitError

    try:
        specs = sweep_job_specs(SweepOptions.of(args))
        requests = prepare(specs)
    except SubmitError as exc:
        print(f"hetero sweep: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps([masked(r) for r in requests], indent=2))
        print(f"hetero sweep: {secret_notice(specs[0])}", file=sys.stderr)
        return 0
    from launcher.log_setup import setup_logging

    setup_logging("sweep", args.log_level)
    clients = Clients(specs[0].region, args.endpoint_url)

    def send() -> int:
        for spec, arn in zip(specs, submit(specs, clients, args.source_dir)):
            print(f"submitted {spec.job_name}: {arn}", flush=True)
        print(f"hetero sweep: {secret_notice(specs[0])}", file=sys.stderr)
        return 0

    return exit_status("hetero sweep", send, (SubmitError,))
