"""Exactly-once accounting from ``RemoteDataset`` audit logs: delivered, lost, duplicated, corrupt.

Each consumer writes one JSON line per batch it hands to the training loop (rank, epoch, batch,
sha256). :func:`check_audit` compares those lines with each rank's share of the epoch plan and
with the bytes the pipeline builds in-process (homogeneous mode), so the fault tests and the
soak count the same way.
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
from typing import Any, Callable, Iterable, Iterator

from hetero.testing.processes import PIPELINE


def _rows(path: str | os.PathLike) -> Iterator[dict]:
    """Audit lines one by one; a torn last line (writer killed mid-write) is skipped."""
    with contextlib.suppress(FileNotFoundError):
        with open(path) as f:
            for line in f:
                with contextlib.suppress(json.JSONDecodeError):
                    yield json.loads(line)


def read_audit(path: str | os.PathLike) -> list[dict]:
    """Audit lines; a torn last line (writer killed mid-write) is ignored."""
    return list(_rows(path))


def resume_point(path: str | os.PathLike, rank: int) -> tuple[int, int]:
    """(last epoch in the audit log for ``rank``, batches of it already delivered), read line by
    line: a consumer that kept every row would grow with the log (about 25 MiB per 45,000 rows)."""
    epoch, position = 0, 0
    for row in _rows(path):
        if row["rank"] != rank:
            continue
        if row["epoch"] > epoch:
            epoch, position = row["epoch"], 0
        if row["epoch"] == epoch:
            position += 1
    return epoch, position


class Reference:
    """In-process (homogeneous mode) digests of every batch, by (epoch, index); cached."""

    def __init__(self, pipeline: str, options: dict, seed: int) -> None:
        from data_service.contract.pipeline import PipelineSpec

        self.spec = PipelineSpec(pipeline, options)
        self.seed = seed
        self._cache: dict[int, list[str]] = {}

    def digests(self, epoch: int) -> list[str]:
        if epoch not in self._cache:
            from data_service.contract.tensor_layout import batch_digest
            from dnn_worker import LocalDataset

            ds = LocalDataset(self.spec, seed=self.seed)
            ds.set_epoch(epoch)
            self._cache[epoch] = [batch_digest(b) for b in ds]
        return self._cache[epoch]

    def __call__(self, epoch: int, index: int) -> str:
        return self.digests(epoch)[index]


def account(rows: Iterable[dict], share: Callable[[int], list[int]], ref: Callable[[int, int], str] | None = None,
            complete: bool = False) -> dict[str, Any]:
    """Count delivered, lost, duplicated and corrupt batches in audit lines.

    Args:
        share: rank -> that rank's batch indices of an epoch, in order.
        ref: (epoch, index) -> expected sha256, or None to skip the byte check.
        complete: every epoch seen must be complete (else a rank's last epoch counts up to the
            furthest batch it reached: what lies beyond is not due yet).
    """
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["rank"], r["epoch"])].append(r)
    last_epoch: dict[int, int] = {}
    for rank, epoch in by:
        last_epoch[rank] = max(epoch, last_epoch.get(rank, -1))
    delivered = lost = duplicated = corrupt = foreign = 0
    lost_examples: list[tuple[int, int, int]] = []
    dup_examples: list[tuple[int, int, int]] = []
    for (rank, epoch), lines in sorted(by.items()):
        mine = share(rank)
        pos = {b: i for i, b in enumerate(mine)}
        seen = collections.Counter(x["batch"] for x in lines)
        delivered += len(lines)
        for b, n in seen.items():
            if b not in pos:
                foreign += n
            elif n > 1:
                duplicated += n - 1
                dup_examples.append((rank, epoch, b))
        if complete or epoch < last_epoch[rank]:
            due = mine
        else:
            furthest = max((pos[b] for b in seen if b in pos), default=-1)
            due = mine[:furthest + 1]
        missing = [b for b in due if b not in seen]
        lost += len(missing)
        lost_examples += [(rank, epoch, b) for b in missing[:3]]
        if ref is not None:
            corrupt += sum(1 for x in lines if x["batch"] in pos and x["sha256"] != ref(epoch, x["batch"]))
    # Epochs a rank skipped entirely (between two it reached) are lost too.
    for rank, last in last_epoch.items():
        for epoch in range(last):
            if (rank, epoch) not in by:
                lost += len(share(rank))
                lost_examples.append((rank, epoch, -1))
    return {"delivered": delivered, "lost": lost, "duplicated": duplicated, "corrupt": corrupt,
            "foreign": foreign, "lost_examples": lost_examples[:10], "duplicated_examples": dup_examples[:10]}


def check_audit(paths: str | os.PathLike | Iterable[str | os.PathLike], options: dict, seed: int, world: int = 1,
                complete: bool = True, pipeline: str = PIPELINE, verify: bool = True) -> dict[str, Any]:
    """Account audit logs against the epoch plan of ``pipeline`` and its in-process bytes.

    Args:
        paths: one audit log or several (one per rank).
        options, seed: the pipeline's options and the consumers' seed.
        world: consumer ranks sharing each epoch (batches split with ``drop``).
        complete: see :func:`account`.
        verify: compare each batch's sha256 with the in-process reference.

    Returns:
        The counts of :func:`account`.
    """
    from data_service.contract.pipeline import PipelineSpec
    from data_service.contract.sampler import rank_share

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    rows = [r for p in paths for r in read_audit(p)]
    per_epoch = PipelineSpec(pipeline, options).load().epoch_shape().num_batches
    return account(rows, lambda r: rank_share(per_epoch, r, world, "drop"),
                   Reference(pipeline, options, seed) if verify else None, complete=complete)
