"""One consumer rank that survives kill -9: ``python -m hetero.testing.consumer --servers A,B ...``.

It reads epochs from the data servers with ``RemoteDataset``, whose audit log gets one line per
batch handed to the loop; started again, it resumes where that log ends (the log is the
checkpoint). SIGTERM stops it between batches. :class:`hetero.testing.ConsumerProc` runs it.
"""
from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

from hetero.testing.audit import resume_point
from hetero.testing.processes import TOKEN


def consume(args: argparse.Namespace) -> int:
    """One rank: resume from its audit log, then read epochs until told to stop (SIGTERM)."""
    from data_service.contract.sampler import rank_share
    from dnn_worker import RemoteDataset

    logging.basicConfig(level=logging.ERROR, format="%(asctime)s test-consumer %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ds = RemoteDataset(args.servers.split(","), args.token, seed=args.seed, rank=args.rank, world_size=args.world,
                       audit_path=args.audit, connect_timeout=args.connect_timeout,
                       batch_timeout=args.batch_timeout, window=args.window)
    mine = rank_share(ds.num_batches_per_epoch(), args.rank, args.world, "drop")
    epoch, position = resume_point(args.audit, args.rank)
    if position >= len(mine):
        epoch, position = epoch + 1, 0
    while epoch < args.epochs and not stop.is_set():
        ds.load_state_dict({"epoch": epoch, "seed": args.seed, "position": position,
                            "dp_rank": args.rank, "dp_size": args.world})
        for _ in ds:
            if args.step_s:
                time.sleep(args.step_s)
            if stop.is_set():
                return 0
        epoch, position = epoch + 1, 0
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetero.testing.consumer", description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", required=True, help="comma-separated host:port of the data servers")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--audit", required=True, help="audit log (JSON lines), also the resume point")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--token", default=TOKEN)
    p.add_argument("--step-s", type=float, default=0.0, help="sleep per batch (an emulated training step)")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument("--batch-timeout", type=float, default=15.0)
    p.add_argument("--window", type=int, default=4)
    return consume(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
