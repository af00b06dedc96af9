"""``hetero shutdown``: stop data servers with the job token; ``--drain`` waits until each has left."""
from __future__ import annotations

import argparse
import os
import sys
import time


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "shutdown", "shut data servers down (authenticated)",
                    "Ask data servers to leave: a server that joined a registry removes its entry "
                    "first, then refuses new requests (consumers ask other servers) and finishes "
                    "those it took. With --drain, wait until each server has left.")
    p.add_argument("servers", nargs="+", help="host:port of each data server")
    p.add_argument("--token", default=None, help="job token (default: $HETERO_JOB_TOKEN)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds each server may take to finish its requests")
    p.add_argument("--drain", action="store_true",
                   help="wait until each server has finished what it owes and stopped (up to --grace + 30 s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from data_service.protocol.addresses import split_address

    for address in args.servers:  # every address checked before any server is asked (and the slow imports)
        split_address(address, "server address")
    import grpc

    from data_service.errors import DataServiceError
    from dnn_worker.transport.control import ControlClient, refused, unreachable

    token = args.token or os.environ.get("HETERO_JOB_TOKEN", "")
    rc = 0
    asked = []
    for address in args.servers:
        try:
            with ControlClient(address, token, "hetero-shutdown") as ctl:
                try:
                    already = ctl.shutdown(grace_s=args.grace, reason="hetero shutdown --drain" if args.drain
                                           else "hetero shutdown")
                except grpc.RpcError as err:
                    if not refused(err):
                        raise unreachable(err, address) from err
                    # idempotent: a server that already stopped is what was asked for
                    print(f"{address}: not serving (nothing listens there: already stopped)", flush=True)
                    continue
            print(f"{address}: {'already shutting down' if already else 'shutting down'}", flush=True)
            asked.append(address)
        except DataServiceError as exc:
            print(f"hetero shutdown: {exc}", file=sys.stderr, flush=True)
            rc = 1
    if args.drain:
        for address in asked:
            waited = wait_gone(address, token, args.grace + 30.0)
            if waited is None:
                print(f"hetero shutdown: {address} still serving after {args.grace + 30.0:.0f} s", file=sys.stderr)
                rc = 1
            else:
                print(f"{address}: drained, left after {waited:.1f} s", flush=True)
    return rc


def wait_gone(address: str, token: str, deadline_s: float, poll_s: float = 0.2) -> float | None:
    """Seconds until ``address`` stopped answering, or None if it still answers after ``deadline_s``."""
    import grpc

    from data_service.errors import DataServiceError
    from dnn_worker.transport.control import ControlClient

    start = time.monotonic()
    with ControlClient(address, token, "hetero-shutdown") as ctl:
        while time.monotonic() - start < deadline_s:
            try:
                ctl.hello(timeout=1.0)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.UNAVAILABLE:
                    return time.monotonic() - start
            except DataServiceError:
                pass
            time.sleep(poll_s)
    return None
