"""Data nodes started in-process, and one epoch read through ``RemoteDataset`` by every rank of a world,
checked against the in-process batches."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from conftest import TOKEN
from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions
from dnn_worker import RemoteDataset
from hetero.testing import read_audit


@contextlib.contextmanager
def data_nodes(pipeline: str, options: dict, n: int, *, cache_root: Path | None = None,
               probe: bool = True) -> Iterator[list[DataServer]]:
    """``n`` started data servers of ``pipeline`` with one worker each, shut down on exit. With ``cache_root``
    each has its own node cache below it (``node0``, ``node1``, ...), as separate machines have."""
    before = os.environ.get("HETERO_CACHE_DIR")
    servers: list[DataServer] = []
    try:
        for i in range(n):
            if cache_root is not None:
                os.environ["HETERO_CACHE_DIR"] = str(cache_root / f"node{i}")
            servers.append(DataServer(PipelineSpec(pipeline, options), TOKEN,
                                      ServerOptions(num_workers=1, probe=probe)).start())
        yield servers
    finally:
        for s in servers:
            s.shutdown(grace_s=1)
        if cache_root is not None:
            if before is None:
                os.environ.pop("HETERO_CACHE_DIR", None)
            else:
                os.environ["HETERO_CACHE_DIR"] = before


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
