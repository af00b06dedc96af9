"""``hetero autoscale JOB``: let a running SageMaker job add its own data nodes.

The job runs with ``autoscale.mode=act autoscale.actuator=sagemaker`` (and its limits:
``autoscale.max``, ``autoscale.usd_per_hour``, ...); this command, run from anywhere with AWS
credentials, writes the data-only job its rank 0 starts for each node it adds (``hetero
submit --join``'s job of one data node: Managed Spot unless ``--on-demand``, a warm pool of
``--keep-alive`` seconds) beside the job's registry. ``--dry-run`` prints it and writes nothing.

``--act`` (for a job left in ``autoscale.mode=advise``): this command is the autoscaler. It reads
the job's advice lines from CloudWatch Logs every ``--poll-s``, decides with the same policy and
limits (``--min``, ``--max``, ``--usd-per-hour``, ``--cooldown-s``, ``--in-after``), starts
data-only jobs to add nodes and stops the newest of them to drain (SageMaker's SIGTERM makes a
server leave the registry first), until the job ends. Its limits are checked before the template
is written. Its state lives beside the registry, so it can be stopped and started again. See
docs/autoscale.md for the IAM both need.
"""
from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "autoscale", "let a running SageMaker job add its own data nodes", __doc__, raw=True)
    p.add_argument("job", metavar="JOB", help="the running training job's name")
    p.add_argument("--region", default=None, help="AWS region (default: the configured one)")
    p.add_argument("--instance-type", default=None, help="the added data nodes' type (default: the job's data group's)")
    p.add_argument("--on-demand", action="store_true", help="on-demand instead of Managed Spot")
    p.add_argument("--keep-alive", type=int, default=0, metavar="SECONDS",
                   help="warm pool: keep a released node SECONDS (KeepAlivePeriodInSeconds, up to 3600) so a "
                        "replacement starts in seconds")
    p.add_argument("--max-run", type=int, default=86400, help="each data-only job's MaxRuntimeInSeconds")
    p.add_argument("--dry-run", action="store_true", help="print the template; no write")
    p.add_argument("--act", action="store_true", help="act on the job's advice from here until it ends")
    p.add_argument("--min", type=int, default=1, help="with --act: data nodes kept at least")
    p.add_argument("--max", type=int, default=8, help="with --act: data nodes at most")
    p.add_argument("--usd-per-hour", type=float, default=0.0, help="with --act: cap on the data nodes' $/h (0: none)")
    p.add_argument("--cooldown-s", type=float, default=300.0, help="with --act: seconds between actions")
    p.add_argument("--in-after", type=int, default=2, help="with --act: advice windows saying fewer before a drain")
    p.add_argument("--poll-s", type=float, default=60.0, help="with --act: seconds between reads of the job's logs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from data_service.errors import ConfigError
    from hetero.sagemaker.client import exit_status

    return exit_status("hetero autoscale", lambda: _run(args), (ConfigError,))


def _run(args: argparse.Namespace) -> int:
    from hetero.sagemaker.data_job_template import join_template, write_template
    from hetero.sagemaker.client import Clients, resolve_region
    from hetero.sagemaker.join import describe

    region = resolve_region(args.region)
    job = describe(Clients(region), args.job)
    template = join_template(job, region=region, instance_type=args.instance_type, spot=not args.on_demand,
                             keep_alive_s=args.keep_alive, max_run_s=args.max_run)
    settings = act_settings(args, job) if args.act else None  # a bad limit writes nothing
    if args.dry_run:
        print(json.dumps(template, indent=1, sort_keys=True))
        return 0
    where = write_template(job, template)
    kind = template["ResourceConfig"]["InstanceGroups"][0]["InstanceType"]
    how = f"{'on-demand' if args.on_demand else 'Managed Spot'}" + (f", warm pool {args.keep_alive} s"
                                                                    if args.keep_alive else "")
    if not args.act:
        print(f"wrote {where}: {args.job}'s rank 0 adds data nodes of {kind} as data-only jobs ({how}) when it "
              "runs with autoscale.mode=act autoscale.actuator=sagemaker")
        return 0
    print(f"wrote {where}; acting on {args.job}'s advice: data nodes of {kind} ({how}) between {args.min} and "
          f"{args.max}", flush=True)
    return act(args, Clients(region), job, template, settings=settings)


MAX_POLL_S = 3600.0  # a read of the job's logs at least hourly: a slower one acts on stale advice


def act_settings(args: argparse.Namespace, job: dict):
    """The checked ``--act`` settings for running ``job``.

    Raises:
        ConfigError: a limit out of range (``--min`` above ``--max``, ...) or a bad ``--poll-s``,
            naming the value and the range.
    """
    import math

    from data_service.errors import ConfigError
    from hetero.sagemaker.join import registry_of
    from launcher.autoscale import Settings

    try:
        settings = Settings.from_options({"mode": "act", "actuator": "sagemaker", "min": args.min, "max": args.max,
                                          "usd_per_hour": args.usd_per_hour, "cooldown_s": args.cooldown_s,
                                          "in_after": args.in_after}, registry=registry_of(job))
    except ConfigError as exc:
        # the options are named as this command's flags
        text = str(exc).replace("autoscale.usd_per_hour=", "--usd-per-hour ").replace("autoscale.min=", "--min ") \
            .replace("autoscale.max=", "--max ").replace("autoscale.cooldown_s=", "--cooldown-s ") \
            .replace("autoscale.in_after=", "--in-after ")
        raise ConfigError(text) from None
    if not (math.isfinite(args.poll_s) and 0 < args.poll_s <= MAX_POLL_S):
        raise ConfigError(f"--poll-s {args.poll_s!r} must be a finite number of seconds in (0, {MAX_POLL_S:g}]")
    return settings


def act(args: argparse.Namespace, clients, job: dict, template: dict, sleep=None, settings=None) -> int:
    """The autoscaler outside the job: its advice lines from CloudWatch in, data-only jobs out."""
    import time

    from hetero.sagemaker.follow import TERMINAL, LogTail
    from hetero.sagemaker.join import describe, registry_of
    from launcher.autoscale import Autoscaler
    from launcher.autoscale.sagemaker_actuator import SageMakerActuator
    from launcher.metric_lines import parse_advice_line

    sleep = sleep or time.sleep
    registry = registry_of(job)
    settings = settings or act_settings(args, job)
    actuator = SageMakerActuator(registry, clients.sagemaker, template=template)
    scaler = Autoscaler(settings, actuator, registry, "", drain_by_actuator=True)
    actuator.jobs = [j for j in scaler.started if j not in scaler.drained]  # a restarted controller's jobs
    done = max((h.get("step", 0) for h in scaler.history), default=None)
    tail = LogTail(clients.logs, args.job)
    try:
        while True:
            advice = [a for a in map(parse_advice_line, tail.poll()) if a is not None and not a["final"]]
            if done is None:  # the first read: act on the newest advice only, not the job's past
                advice = advice[-1:]
            for a in advice:
                if done is None or a["step"] > done:
                    scaler.on_advice(a)
                    done = a["step"]
            scaler.wait(600.0)  # one decision's calls at a time
            status = describe(clients, args.job)["TrainingJobStatus"]
            if status in TERMINAL:
                print(f"{args.job} is {status}: {scaler.summary()['actions']} action(s) taken", flush=True)
                return 0
            sleep(args.poll_s)
    finally:
        scaler.close()
