"""Data servers reading shards: the same bytes for every cluster shape and store, affinity, a node killed.

The shards are written once per module (a small drawn-shape folder, shards of about 1 MB); the
servers are real ``hetero serve`` processes or in-process servers with real worker processes.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from _epoch_audit import data_nodes, read_epoch_and_check
from conftest import TOKEN
from data_service.contract.tensor_layout import batch_digest
from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions
from dnn_worker import LocalDataset, RemoteDataset
from data_service.prepare.writer import prepare
from hetero.testing import read_audit

PIPELINE = "data_service.pipelines.images:build_pipeline"
BASE = {"batch_size": 8, "image_size": 32, "shuffle_block": 32, "interleave": 4, "drop_last": False}


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory) -> Path:
    from hetero.synthetic.images import write_image_folder

    root = tmp_path_factory.mktemp("shards")
    write_image_folder(root / "src", per_class=50, classes=4, seed=1)  # 200 images: 25 batches, 7 blocks
    prepare(str(root / "src"), str(root / "shards"), shard_size=1_000_000, workers=1, progress=False)
    return root / "shards"


def reference(options: dict, seed: int = 5, epoch: int = 0) -> list[str]:
    ds = LocalDataset(PipelineSpec(PIPELINE, options), seed=seed)
    ds.set_epoch(epoch)
    return [batch_digest(b) for b in ds]


@pytest.mark.parametrize("nservers, world", [(1, 1), pytest.param(3, 2, marks=pytest.mark.slow)])
def test_every_cluster_shape_gives_the_in_process_batches(shard_dir, tmp_path, nservers, world):
    options = {**BASE, "shards": str(shard_dir)}
    ref = reference(options, epoch=1)
    with data_nodes(PIPELINE, options, nservers) as servers:
        built = read_epoch_and_check(servers, ref, tmp_path / "audit.jsonl", world)
    assert sum(1 for b in built if b > 1) >= min(nservers, 2), built  # affinity spreads blocks over servers


@pytest.mark.slow
def test_each_block_is_built_by_its_owner_only(shard_dir):
    """With every server up, a block's batches all come from one server, the same on every rank.

    Each rank reads epochs until both connections are up (on a loaded machine a server's first
    Hello may miss its deadline, and its blocks go to the other until it connects), then the next
    epoch on the same connections is watched."""
    from dnn_worker.fetch.affinity import Affinity

    options = {**BASE, "shards": str(shard_dir)}
    with data_nodes(PIPELINE, options, 2) as servers:
        addresses = [s.address for s in servers]
        owners: dict[int, set[str]] = {}
        for rank in range(2):
            ds = RemoteDataset(addresses, TOKEN, seed=2, rank=rank, world_size=2, epochs=None)
            for _ in range(20):  # connections kept open from one epoch to the next (epochs=None)
                list(ds)
                if all(s.conn is not None for s in ds.fetcher.servers):
                    break
            else:
                pytest.fail(f"rank {rank}: not connected to both servers after 20 epochs: "
                            f"{[(s.address, s.last_error) for s in ds.fetcher.servers]}")
            aff = Affinity(ds.hello().dataset)
            from dnn_worker.fetch.server_set import ServerSet

            seen = []
            original = ServerSet.send

            def spy(self, address, refs, hint=False, _seen=seen, _orig=original):
                if not hint:
                    _seen += [(aff.block(r), address) for r in refs]
                return _orig(self, address, refs, hint)

            ServerSet.send = spy
            try:
                list(ds)
            finally:
                ServerSet.send = original
            for block, address in seen:
                owners.setdefault(block, set()).add(address)
        assert all(len(v) == 1 for v in owners.values()), owners
        assert len({next(iter(v)) for v in owners.values()}) == 2


@pytest.mark.slow  # a kill -9 of a server reading a plain folder runs by default in test_multinode.py
def test_a_data_node_killed_mid_epoch_loses_and_duplicates_nothing(shard_dir, server_process, tmp_path):
    options = {**BASE, "shards": str(shard_dir)}
    ref = reference(options)
    a, b = (server_process(options, pipeline=PIPELINE).start() for _ in range(2))
    kill_one_mid_epoch(a, b, ref, tmp_path / "audit.jsonl")


def kill_one_mid_epoch(a, b, ref: list[str], audit: Path) -> None:
    """Read an epoch from servers ``a`` and ``b``, kill -9 ``a`` after 5 batches; check bytes and audit."""
    ds = RemoteDataset([a.address, b.address], TOKEN, seed=5, window=2, audit_path=audit, connect_timeout=20)
    got = []
    for batch in ds:
        got.append(batch_digest(batch))
        if len(got) == 5:
            a.kill()  # kill -9 with requests outstanding: its blocks move to the other node
    assert got == ref
    assert sorted(x["batch"] for x in read_audit(audit)) == list(range(len(ref)))


def test_owners_hear_of_their_next_blocks_before_they_are_asked_for_them(tmp_path):
    """Hints: a block's data is prefetched several batches before the first of its batches is built."""
    log = tmp_path / "events"
    spec = PipelineSpec("tests._prefetch_pipeline:build", {"log": str(log)})
    server = DataServer(spec, TOKEN, ServerOptions(num_workers=1, probe=False)).start()
    try:
        ds = RemoteDataset([server.address], TOKEN, seed=1, window=1)
        assert len(list(ds)) == 32
    finally:
        server.shutdown(grace_s=1)
    events = [line.split() for line in log.read_text().splitlines()]
    gets = [int(b) for kind, b in events if kind == "get"]
    first_get = {b: gets.index(b) for b in set(gets)}
    first_prefetch = {}
    built = 0
    for kind, b in events:
        built += kind == "get"
        first_prefetch.setdefault(int(b), built) if kind == "prefetch" else None
    late = sorted(first_get, key=first_get.get)[2:]  # blocks after the first group of two
    leads = [(first_get[b] - first_prefetch[b]) // 4 for b in late]  # in batches of 4 samples
    assert min(leads) >= 3, leads  # asked for one batch ahead (window 1): a lead of 3+ is the hint


def test_the_image_pipeline_prefetches_each_shard_block_once_through_its_server_side(shard_dir, monkeypatch):
    """The image pipeline's ``server_side`` hands the data server its shard source as block
    prefetcher: every block of the epoch is prefetched once, hinted and requested alike."""
    from data_service.shards import ShardDataset

    calls = []
    real = ShardDataset.prefetch_block
    monkeypatch.setattr(ShardDataset, "prefetch_block", lambda self, block: calls.append(block) or real(self, block))
    options = {**BASE, "shards": str(shard_dir)}
    side = PipelineSpec(PIPELINE, options).server_side()
    assert isinstance(side.prefetcher, ShardDataset) and side.prefetcher.block_samples == 32
    with data_nodes(PIPELINE, options, 1) as [server]:
        assert [batch_digest(b) for b in RemoteDataset([server.address], TOKEN, seed=5, window=2)] == reference(options)
    assert sorted(calls) == list(range(7)), calls  # 200 samples in blocks of 32
