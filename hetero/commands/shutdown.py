"""``hetero shutdown``: stop data servers with the job token."""
from __future__ import annotations

import argparse
import os


def register(sub) -> None:
    p = sub.add_parser("shutdown", help="shut data servers down (authenticated)")
    p.add_argument("servers", nargs="+", help="host:port of each data server")
    p.add_argument("--token", default=None, help="job token (default: $HETERO_JOB_TOKEN)")
    p.add_argument("--grace", type=float, default=30.0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import grpc

    from data_service.errors import DataServiceError
    from dnn_worker.control import ControlClient

    token = args.token or os.environ.get("HETERO_JOB_TOKEN", "")
    rc = 0
    for address in args.servers:
        try:
            with ControlClient(address, token, "hetero-shutdown") as ctl:
                already = ctl.shutdown(grace_s=args.grace, reason="hetero shutdown")
            print(f"{address}: {'already shutting down' if already else 'shutting down'}")
        except (grpc.RpcError, DataServiceError) as exc:
            print(f"{address}: {exc}")
            rc = 1
    return rc
