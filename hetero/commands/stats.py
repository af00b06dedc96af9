"""``hetero stats``: print a data server's counters."""
from __future__ import annotations

import argparse
import os


def register(sub) -> None:
    p = sub.add_parser("stats", help="print a data server's stats")
    p.add_argument("server", help="host:port")
    p.add_argument("--token", default=None, help="job token (default: $HETERO_JOB_TOKEN)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToJson

    from dnn_worker.control import ControlClient

    with ControlClient(args.server, args.token or os.environ.get("HETERO_JOB_TOKEN", ""), "hetero-stats") as ctl:
        print(MessageToJson(ctl.stats(), always_print_fields_with_no_presence=True))
    return 0
