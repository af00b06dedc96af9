"""``hetero stats``: print a data server's counters, or the live advice of a running local job.

``hetero stats HOST:PORT`` asks one data server for its counters (the authenticated GetStats
call). ``hetero stats --local OUTPUT`` reads the node logs ``hetero local`` writes to
``OUTPUT/logs`` while the job runs and prints rank 0's latest step line, advice line (data
nodes to add or that could go, the step time that gives, the cost) and autoscaler decision (the
node change, the data nodes before and after, the figures it used), with their figures as JSON,
read by the same regular expressions as the job's ``MetricDefinitions``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

_ADVICE = "launcher.advice.advisor: advice at step"
_AUTOSCALE = "launcher.autoscale.controller: autoscale at step"
_WINDOW = re.compile(r"launcher\.train\.step_stats: step \d+: avg step time")


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "stats", "print a data server's stats, or a running local job's advice", __doc__, raw=True)
    p.add_argument("server", nargs="?", help="host:port of a data server")
    p.add_argument("--token", default=None, help="job token (default: $HETERO_JOB_TOKEN)")
    p.add_argument("--local", type=Path, default=None, metavar="OUTPUT",
                   help="a running `hetero local` job's --output folder: print its latest step time and advice")
    p.set_defaults(func=run)


def latest_advice(logs: Path) -> dict | None:
    """The newest advice line and step line in the ``*.log`` files of ``logs`` (None: no advice yet).

    Returns:
        ``{"log": file, "advice": line, "step": line or None, "autoscale": line or None,
        "figures": {metric: value}}`` (the autoscaler's figures too when it decided).
    """
    from launcher.metric_lines import METRIC_DEFINITIONS

    found: dict[str, Any] | None = None
    for path in sorted(logs.glob("*.log")):
        advice = step = scaled = None
        for line in path.read_text(errors="replace").splitlines():
            if _ADVICE in line:
                advice = line
            elif _AUTOSCALE in line:
                scaled = line
            elif _WINDOW.search(line):
                step = line
        if advice is not None and (found is None or advice[:23] > found["advice"][:23]):  # newest timestamp
            found = {"log": str(path), "advice": advice, "step": step, "autoscale": scaled}
    if found is None:
        return None
    found["figures"] = {}
    for kind in ("advice", "autoscale"):  # the advice line is always there, the autoscaler's when it decided
        if found[kind]:
            text = found[kind][found[kind].index(f"{kind} at step"):]
            found["figures"].update({d["Name"]: float(m.group(1)) for d in METRIC_DEFINITIONS
                                     if d["Name"].startswith(f"{kind}:") and (m := re.search(d["Regex"], text))})
    return found


def run_local(output: Path) -> int:
    logs = output / "logs"
    if not logs.is_dir():
        print(f"hetero stats: {logs} does not exist: pass the --output folder of a running `hetero local` job "
              "(default out/local)", file=sys.stderr)
        return 2
    found = latest_advice(logs)
    if found is None:
        print(f"hetero stats: no advice in {logs} yet: rank 0 advises every advice_every steps (default 200) after "
              "the warm-up, and at the end; a homogeneous job or advice_every=0 has none", file=sys.stderr)
        return 1
    age = time.time() - os.path.getmtime(found["log"])
    print(f"{found['log']} (written {age:.0f} s ago):")
    if found["step"]:
        print("  " + found["step"])
    print("  " + found["advice"])
    if found.get("autoscale"):
        print("  " + found["autoscale"])
    print(json.dumps(found["figures"], indent=2, sort_keys=True))
    return 0


def run(args: argparse.Namespace) -> int:
    from hetero.console import CommandError

    if args.local is not None:
        return run_local(args.local)
    if not args.server:
        raise CommandError("give a data server's host:port, or --local OUTPUT for a running local job", 2)
    from data_service.protocol.addresses import split_address

    address = args.server
    split_address(address, "server address")  # e.g. localhost:6000, before the slow imports below
    import grpc
    from google.protobuf.json_format import MessageToJson

    from dnn_worker.transport.control import ControlClient, unreachable

    with ControlClient(address, args.token or os.environ.get("HETERO_JOB_TOKEN", ""), "hetero-stats") as ctl:
        try:
            stats = ctl.stats()
        except grpc.RpcError as err:  # the product's errors (a refused token) are said by hetero's one error path
            raise unreachable(err, address) from err
    print(MessageToJson(stats, always_print_fields_with_no_presence=True))
    return 0
