"""One epoch read through ``RemoteDataset`` by every rank of a world, checked against the in-process batches."""

from __future__ import annotations

from pathlib import Path

from conftest import TOKEN
from dnn_worker import RemoteDataset
from hetero.testing import read_audit


def read_epoch_and_check(servers, ref: dict, audit: Path, world: int, *, seed: int = 5, epoch: int = 1) -> list[int]:
    """Every rank of ``world`` reads ``epoch`` from ``servers``; each batch is audited once, with the bytes of
    ``ref`` (batch -> sha256 of the in-process batch). Returns each server's count of batches built."""
    for rank in range(world):
        ds = RemoteDataset([s.address for s in servers], TOKEN, seed=seed, rank=rank, world_size=world,
                           audit_path=audit)
        ds.set_epoch(epoch)
        list(ds)
    rows = read_audit(audit)
    assert len(rows) == len(ref) // world * world and len({x["batch"] for x in rows}) == len(rows)
    assert all(x["sha256"] == ref[x["batch"]] for x in rows)
    return [s.stats.snapshot().batches_built for s in servers]
