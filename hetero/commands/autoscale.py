"""``hetero autoscale JOB``: let a running SageMaker job add its own data nodes.

The job runs with ``autoscale.mode=act autoscale.actuator=sagemaker`` (and its limits:
``autoscale.max``, ``autoscale.usd_per_hour``, ...); this command, run from anywhere with AWS
credentials, writes the data-only job its rank 0 starts for each node it adds (``hetero
submit --join``'s job of one data node: Managed Spot unless ``--on-demand``, a warm pool of
``--keep-alive`` seconds) beside the job's registry. ``--dry-run`` prints it and writes nothing.
See docs/autoscale.md for the IAM the job's role needs.
"""
from __future__ import annotations

import argparse
import json
import sys


def register(sub) -> None:
    p = sub.add_parser("autoscale", help="let a running SageMaker job add its own data nodes",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", metavar="JOB", help="the running training job's name")
    p.add_argument("--region", default=None, help="AWS region (default: the configured one)")
    p.add_argument("--instance-type", default=None, help="the added data nodes' type (default: the job's data group's)")
    p.add_argument("--on-demand", action="store_true", help="on-demand instead of Managed Spot")
    p.add_argument("--keep-alive", type=int, default=0, metavar="SECONDS",
                   help="warm pool: keep a released node SECONDS (KeepAlivePeriodInSeconds, up to 3600) so a "
                        "replacement starts in seconds")
    p.add_argument("--max-run", type=int, default=86400, help="each data-only job's MaxRuntimeInSeconds")
    p.add_argument("--dry-run", action="store_true", help="print the template; no write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    from data_service.errors import ConfigError
    from hetero.sagemaker.autoscale import join_template, write_template
    from hetero.sagemaker.client import Clients, resolve_region
    from hetero.sagemaker.join import describe

    try:
        region = resolve_region(args.region)
        job = describe(Clients(region), args.job)
        template = join_template(job, region=region, instance_type=args.instance_type, spot=not args.on_demand,
                                 keep_alive_s=args.keep_alive, max_run_s=args.max_run)
        if args.dry_run:
            print(json.dumps(template, indent=1, sort_keys=True))
            return 0
        where = write_template(job, template)
    except ConfigError as exc:
        print(f"hetero autoscale: {exc}", file=sys.stderr)
        return 2
    except (ClientError, BotoCoreError) as exc:
        print(f"hetero autoscale: AWS refused: {exc}", file=sys.stderr)
        return 1
    kind = template["ResourceConfig"]["InstanceGroups"][0]["InstanceType"]
    print(f"wrote {where}: {args.job}'s rank 0 adds data nodes of {kind} as data-only jobs "
          f"({'on-demand' if args.on_demand else 'Managed Spot'}"
          f"{f', warm pool {args.keep_alive} s' if args.keep_alive else ''}) when it runs with "
          "autoscale.mode=act autoscale.actuator=sagemaker")
    return 0
