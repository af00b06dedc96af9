"""CPU per built batch of one pipeline, three ways: in this process, a DataLoader worker, a data server.

The homogeneous baseline is honest only if a batch costs the same CPU there as on a data node.
This builds the image pipeline's batches (all on one pinned core) in-process with ``build_batch``,
through ``DataLoader(LocalDataset, num_workers=1)`` (what ``homogeneous_loader=dataloader`` runs)
and through a data server with one worker and ``RemoteDataset`` over shared memory (a data node,
and ``homogeneous_loader=server``; its worker forked from the warm parent, the default, and
spawned), and prints the CPU seconds per batch of the building
processes and of the consumer, over ``--batches`` batches after a warm-up, ``--rounds`` times.

    python -m benchmarks.batch_cpu --images-dir /tmp/photos --batches 60 --rounds 3
"""
from __future__ import annotations

import os
import statistics
import sys
import time

from benchmarks.common import cli, report
from benchmarks.common.proc import descendants, tree_cpu, usage

PIPELINE = "data_service.pipelines.images:build_pipeline"


def in_process(options: dict, n: int) -> tuple[float, float]:
    import torch

    from data_service.contract.pipeline import PipelineSpec, build_batch

    pipe = PipelineSpec(PIPELINE, options).load()
    cfg = pipe.epoch_shape()
    torch.set_num_threads(1)
    for i in range(5):
        build_batch(pipe, cfg, 1, 0, i)
    t = time.process_time()
    for i in range(5, 5 + n):
        build_batch(pipe, cfg, 1, 0, i)
    return (time.process_time() - t) / n, 0.0


def dataloader(options: dict, n: int) -> tuple[float, float]:
    from torch.utils.data import DataLoader

    from data_service.contract.pipeline import PipelineSpec
    from dnn_worker import LocalDataset

    loader = DataLoader(LocalDataset(PipelineSpec(PIPELINE, options), seed=1), batch_size=None, num_workers=1,
                        multiprocessing_context="forkserver", persistent_workers=True)
    it = iter(loader)
    for _ in range(5):
        next(it)
    # the worker is a child of the forkserver: every descendant once, by its own CPU
    kids = descendants(os.getpid())
    k0, m0 = usage(kids)[0], time.process_time()
    for _ in range(n):
        next(it)
    k1, m1 = usage(kids)[0], time.process_time()
    return (k1 - k0) / n, (m1 - m0) / n


def data_server(options: dict, n: int, worker_start: str = "warm") -> tuple[float, float]:
    from dnn_worker import RemoteDataset
    from hetero.testing.processes import TOKEN, ServerProc

    server = ServerProc(options, workers=1, pipeline=PIPELINE, worker_start=worker_start).start()
    try:
        it = iter(RemoteDataset([server.address], TOKEN, seed=1))
        for _ in range(5):
            next(it)
        k0, m0 = tree_cpu(server.proc.pid), time.process_time()
        for _ in range(n):
            next(it)
        k1, m1 = tree_cpu(server.proc.pid), time.process_time()
        return (k1 - k0) / n, (m1 - m0) / n
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--images-dir", default="/tmp/photos")
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--decode", default="fused", choices=("fused", "whole"))
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1)
    args = ap.parse_args(argv)
    from benchmarks.photos import write_photo_folder

    need = args.batch_size * (args.batches + 12)
    write_photo_folder(args.images_dir, need)
    os.sched_setaffinity(0, {args.cpu})  # every process below inherits the one core
    options = {"data_dir": args.images_dir, "batch_size": args.batch_size, "limit": need, "decode": args.decode}
    print(f"{need} photo-like JPEGs, batch {args.batch_size}, decode={args.decode}, everything on CPU {args.cpu}, "
          f"{args.batches} batches x {args.rounds} rounds, {report.stamp()}")
    ways = {"in-process build_batch": in_process, "DataLoader worker (LocalDataset)": dataloader,
            "data server, 1 worker (RemoteDataset)": data_server,
            "data server, 1 spawned worker": lambda o, n: data_server(o, n, "spawn")}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in ways}
    for r in range(args.rounds):
        for name, fn in ways.items():
            built, consumer = fn(options, args.batches)
            got[name].append((built, consumer))
            print(f"  round {r + 1} {name}: {built * 1000:.1f} ms CPU per batch built, consumer {consumer * 1000:.1f} ms",
                  flush=True)
    base = statistics.median(b for b, _ in got["in-process build_batch"])
    print(f"\n| where the batch is built | CPU ms per batch (builders) | consumer CPU ms | vs in-process |\n|---|---|---|---|")
    for name, runs in got.items():
        b, c = statistics.median(x for x, _ in runs), statistics.median(y for _, y in runs)
        print(f"| {name} | {b * 1000:.1f} | {c * 1000:.1f} | {b / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
