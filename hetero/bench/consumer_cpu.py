"""The consumer's CPU per batch, with and without resume bookkeeping, alternating in one process.

``python -m hetero.bench.consumer_cpu`` feeds the same in-memory MNIST-sized batches (uint8
[B, 1, 28, 28] + int64 labels, the finish stage of examples.mnist) through two loops:

* **bare**: ``for batch in DataLoader(dataset)``, then the finish stage: no state, no prefetch;
* **stages**: ``DeviceFeeder(ResumableLoader(DataLoader(dataset)), depth=2)``: the same work plus
  the state contract (a state snapshot per batch, the feeder's prefetch queue, epoch tracking).

Rounds alternate (bare, stages, stages, bare, ...) so drift hits both; each round reports process
CPU seconds (``time.process_time``) per batch. Compare the median difference with the spread of
the bare rounds (run-to-run noise).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from data_service.contract.batch_id import BatchId
from dnn_worker import DeviceFeeder, ResumableLoader
from dnn_worker.device.feeder import FinishStage
from dnn_worker.resume.batch_list import BatchList
from dnn_worker.resume.sharding import ShardedBatches


class _InMemory(ShardedBatches):
    """Pre-built batches: what is measured is the consumer, not batch building."""

    def __init__(self, batches: list[Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches = batches

    def num_batches_per_epoch(self) -> int:
        return len(self.batches)

    def _batches(self, items: BatchList) -> Iterator[tuple[BatchId, Any]]:
        for which in items:
            yield which, self.batches[which.index]


def _batches(n: int, batch_size: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [{"image": torch.randint(0, 256, (batch_size, 1, 28, 28), dtype=torch.uint8, generator=g),
             "label": torch.randint(0, 10, (batch_size,), generator=g)} for _ in range(n)]


def _bare(ds: _InMemory, finish: FinishStage) -> int:
    n = 0
    for batch in DataLoader(ds, batch_size=None):
        finish(batch)
        n += 1
    return n


def _stages(ds: _InMemory, finish: FinishStage) -> int:
    feeder = DeviceFeeder(ResumableLoader(DataLoader(ds, batch_size=None)), "cpu", finish=finish, depth=2)
    n = 0
    for _ in feeder:
        feeder.state_dict()  # what a loop checkpointing every step would ask for
        n += 1
    return n


def measure(batches: int = 400, batch_size: int = 64, rounds: int = 8) -> dict:
    """Returns CPU seconds per batch of each round of each loop, and their medians."""
    torch.set_num_threads(1)
    finish = FinishStage.load("examples.mnist:finish", {"image": "float32"})
    data = _batches(batches, batch_size)
    out: dict[str, list[float]] = {"bare": [], "stages": []}
    loops = {"bare": _bare, "stages": _stages}
    for r in range(rounds):
        for name in (("bare", "stages") if r % 2 == 0 else ("stages", "bare")):
            ds = _InMemory(data)
            start = time.process_time()
            n = loops[name](ds, finish)
            out[name].append((time.process_time() - start) / n)
    med = {k: statistics.median(v) for k, v in out.items()}
    return {"rounds": out, "median_s": med, "batches": batches, "batch_size": batch_size,
            "noise_s": max(out["bare"]) - min(out["bare"]), "difference_s": med["stages"] - med["bare"]}


def report(m: dict) -> str:
    med = m["median_s"]
    return (f"consumer CPU per batch ({m['batches']} batches of {m['batch_size']}, {len(m['rounds']['bare'])} "
            f"alternating rounds each): bare DataLoader + finish {med['bare'] * 1e6:.0f} us, "
            f"DeviceFeeder(ResumableLoader(DataLoader)) with state {med['stages'] * 1e6:.0f} us; difference "
            f"{m['difference_s'] * 1e6:+.0f} us, run-to-run spread of the bare loop {m['noise_s'] * 1e6:.0f} us")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetero.bench.consumer_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args(argv)
    print(report(measure(args.batches, args.batch_size, args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
