"""The jobs of ``benchmarks.sweep``: training loops that read one data server side by side, each
with its own seed, step and record, and the audit of each against its own in-process run.

A job is a thread here (its data plane is the same ``RemoteDataset`` a training job's is; the
GIL is let go while it sleeps its emulated step, receives and hashes): four training processes
would each import torch on the two cores the data node needs.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JobRecord:
    """One job: its seed and step, when each batch arrived and how long it waited for it, and its
    audit log (``RemoteDataset(audit_path=)``: epoch, batch, sha256 of each batch handed to the loop)."""

    name: str
    seed: int
    step_s: float
    audit_path: str
    arrivals: list[tuple[float, float]] = field(default_factory=list)  # (monotonic time, seconds waited)
    error: str = ""
    stop_at: float = float("inf")  # monotonic time; the loop ends at its next check after it

    def figures(self, start: float, end: float) -> dict[str, float]:
        """Batches, step time (wall between batches) and data wait per step within [start, end)."""
        mine = [a for a in self.arrivals if start <= a[0] < end]
        if len(mine) < 2:
            return {"batches": len(mine), "step_ms": float("nan"), "wait_ms": float("nan")}
        step = (mine[-1][0] - mine[0][0]) / (len(mine) - 1)
        return {"batches": len(mine), "step_ms": step * 1000, "wait_ms": sum(a[1] for a in mine) / len(mine) * 1000}


def run_job(record: JobRecord, address: str, token: str, started: threading.Barrier) -> None:
    """Read epoch after epoch from ``address`` until ``record.stop_at`` (monotonic), sleeping the
    job's step after each batch; all jobs begin together (``started``)."""
    from dnn_worker import RemoteDataset

    try:
        ds = RemoteDataset([address], token, seed=record.seed, shared_memory=False, batch_timeout=60,
                           audit_path=record.audit_path)
        started.wait(120)
        epoch = 0
        while time.monotonic() < record.stop_at:
            ds.set_epoch(epoch)
            it = iter(ds)
            while time.monotonic() < record.stop_at:
                asked = time.monotonic()
                try:
                    next(it)
                except StopIteration:
                    break
                now = time.monotonic()
                record.arrivals.append((now, now - asked))
                time.sleep(record.step_s)
            else:
                it.close()
            epoch += 1
    except Exception as exc:  # reported in the table: a job that failed has no figures
        record.error = f"{type(exc).__name__}: {exc}"


class References:
    """Each (pipeline options, seed, epoch, index)'s sha256 as built in-process (homogeneous mode),
    built once for every job that needs it."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self._pipes: dict[str, Any] = {}
        self._digests: dict[tuple, str] = {}

    def __call__(self, options: dict, seed: int, epoch: int, index: int) -> str:
        import json

        from data_service.contract.pipeline import PipelineSpec, build_batch
        from data_service.contract.tensor_layout import batch_digest

        tag = json.dumps(options, sort_keys=True)
        key = (tag, seed, epoch, index)
        if key not in self._digests:
            if tag not in self._pipes:
                pipe = PipelineSpec(self.pipeline, options).load()
                self._pipes[tag] = (pipe, pipe.epoch_shape())
            pipe, cfg = self._pipes[tag]
            self._digests[key] = batch_digest(build_batch(pipe, cfg, seed, epoch, index))
        return self._digests[key]

    def close(self) -> None:
        """Close the pipelines built (a decoded-image cache leaves with its last user)."""
        for pipe, _ in self._pipes.values():
            if pipe.close is not None:
                pipe.close()
        self._pipes.clear()


def audit(record: JobRecord, options: dict, refs: References, per_epoch: int) -> dict[str, int]:
    """The job's audit log against its own in-process run: delivered, wrong bytes, skipped (a gap
    in an epoch's order), duplicated. Every epoch it began is read from batch 0 on, in order."""
    from hetero.testing.audit import read_audit

    delivered = wrong = skipped = duplicated = 0
    seen: set[tuple[int, int]] = set()
    position: dict[int, int] = {}
    for row in read_audit(record.audit_path):
        epoch, index, digest = row["epoch"], row["batch"], row["sha256"]
        delivered += 1
        if (epoch, index) in seen:
            duplicated += 1
            continue
        seen.add((epoch, index))
        skipped += max(0, index - position.get(epoch, 0))
        position[epoch] = index + 1
        if digest != refs(options, record.seed, epoch, index):
            wrong += 1
    for epoch in sorted(position)[:-1]:  # every epoch but the last it was in reached its end
        skipped += per_epoch - position[epoch]
    return {"delivered": delivered, "wrong": wrong, "skipped": skipped, "duplicated": duplicated}
