"""Shards straight from S3: moto's real server on loopback behind the fault proxy, real data servers.

The same batches byte for byte as from a local shard folder (1 and 3 data nodes, a node killed
mid-epoch); each block read once per node with a few large ranged GETs and never again while it
is cached; S3 faults retried without changing a byte; set-up problems fail the data server at
start, naming the bucket or key and the fix; a read that keeps failing reaches the consumer
naming the object, within its deadline.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from _s3_env import s3_with_bucket  # noqa: E402
from conftest import TOKEN  # noqa: E402
from data_service.contract.tensor_layout import batch_digest  # noqa: E402
from data_service.errors import BatchBuildError, ConfigError  # noqa: E402
from data_service.contract.pipeline import PipelineSpec  # noqa: E402
from data_service.server import DataServer, ServerOptions  # noqa: E402
from data_service.shards import ShardDataset  # noqa: E402
from data_service.shards.checksum import CorruptSampleError  # noqa: E402
from data_service.shards.format import INDEX_NAME  # noqa: E402
from data_service.storage import S3Store  # noqa: E402
from dnn_worker import LocalDataset, RemoteDataset  # noqa: E402
from data_service.prepare.writer import prepare  # noqa: E402
from hetero.testing import read_audit  # noqa: E402
from test_shards_service import kill_one_mid_epoch  # noqa: E402

PIPELINE = "data_service.pipelines.images:build_pipeline"
BASE = {"batch_size": 8, "image_size": 32, "shuffle_block": 32, "interleave": 4, "drop_last": False}
BUCKET = "shard-tests"
URL = f"s3://{BUCKET}/train"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(local shard folder, the S3 server) with the same shards uploaded under ``URL``; AWS env set."""
    from hetero.synthetic.images import write_image_folder

    root = tmp_path_factory.mktemp("s3shards")
    write_image_folder(root / "src", per_class=50, classes=4, seed=1)
    local = root / "shards"
    prepare(str(root / "src"), str(local), shard_size=1_000_000, workers=1, progress=False)
    with s3_with_bucket(BUCKET) as srv:
        store = S3Store(URL)
        for p in sorted(local.iterdir()):
            if p.name != INDEX_NAME:
                store.write_file(p.name, str(p))
        store.write_file(INDEX_NAME, str(local / INDEX_NAME))
        yield local, srv


def reference(local: Path, seed: int = 5, epoch: int = 0) -> list[str]:
    ds = LocalDataset(PipelineSpec(PIPELINE, {**BASE, "shards": str(local)}), seed=seed)
    ds.set_epoch(epoch)
    return [batch_digest(b) for b in ds]


def serve(n: int, cache_root: Path, options: dict | None = None) -> list[DataServer]:
    servers = []
    for i in range(n):
        os.environ["HETERO_CACHE_DIR"] = str(cache_root / f"node{i}")  # read by this server and its workers
        servers.append(DataServer(PipelineSpec(PIPELINE, options or {**BASE, "shards": URL}), TOKEN,
                                  ServerOptions(num_workers=1)).start())
    os.environ.pop("HETERO_CACHE_DIR", None)
    return servers


def test_each_block_is_a_few_ranged_reads_once_then_cached(world, tmp_path):
    local, srv = world
    ds = ShardDataset(URL, block_samples=32, cache_dir=str(tmp_path))
    plain = ShardDataset(str(local), block_samples=32)
    srv.proxy.reset_counters()
    assert [ds[i] for i in range(len(ds))] == [plain[i] for i in range(len(plain))]
    c = srv.proxy.counters()
    blocks = -(-len(ds) // 32)
    parts = sum(len(ds.block_parts(b)) for b in range(blocks))
    assert c["requests"].get("GET", 0) == c["ranged_gets"] == parts  # one ranged GET per shard a block touches
    assert c["body_bytes"]["GET"] <= 1.1 * ds.index.data_bytes
    srv.proxy.reset_counters()
    again = ShardDataset(URL, block_samples=32, cache_dir=str(tmp_path))  # another process of the node
    srv.proxy.reset_counters()
    assert [again[i][1] for i in range(len(again))] == [plain[i][1] for i in range(len(plain))]
    assert srv.proxy.requests == 0


def test_prefetch_block_brings_a_block_into_the_node_cache_once(world, tmp_path):
    """A ShardDataset is the data node's BlockPrefetcher: a block it prefetched costs the workers nothing."""
    local, srv = world
    prefetcher = ShardDataset(URL, block_samples=32, cache_dir=str(tmp_path))
    srv.proxy.reset_counters()
    prefetcher.prefetch_block(2)
    prefetcher.prefetch_block(2)  # asked again while (or after) it is fetched: nothing more
    deadline = time.monotonic() + 30
    while not prefetcher.cache.files.cached(prefetcher._name(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.proxy.counters()["requests"].get("GET", 0) == len(prefetcher.block_parts(2))
    worker = ShardDataset(URL, block_samples=32, cache_dir=str(tmp_path))  # a worker process of the node
    srv.proxy.reset_counters()
    plain = ShardDataset(str(local), block_samples=32)
    assert [worker[i] for i in range(64, 96)] == [plain[i] for i in range(64, 96)]
    assert srv.proxy.requests == 0
    prefetcher.prefetch_block(2)  # cached: nothing to fetch
    assert srv.proxy.requests == 0


@pytest.mark.parametrize("nservers", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_the_same_batches_as_from_a_local_folder(world, tmp_path, nservers):
    local, srv = world
    ref = reference(local, epoch=1)
    servers = serve(nservers, tmp_path)
    try:
        srv.proxy.reset_counters()
        ds = RemoteDataset([s.address for s in servers], TOKEN, seed=5)
        ds.set_epoch(1)
        assert [batch_digest(b) for b in ds] == ref
        data = sum(os.path.getsize(p) for p in local.glob("*.tar"))
        assert srv.proxy.get_bytes <= 1.1 * data  # each block read by one node only
    finally:
        for s in servers:
            s.shutdown(grace_s=1)


@pytest.mark.slow  # tests/test_shards_service.py kills a node reading a local shard folder
def test_a_data_node_killed_mid_epoch_loses_and_duplicates_nothing(world, server_process, tmp_path):
    local, _ = world
    ref = reference(local)
    options = {**BASE, "shards": URL}
    a, b = (server_process(options, pipeline=PIPELINE, env={"HETERO_CACHE_DIR": str(tmp_path / f"n{i}")}).start()
            for i in range(2))
    kill_one_mid_epoch(a, b, ref, tmp_path / "audit.jsonl")


@pytest.mark.parametrize("fault", ["503", "500", "reset", "reset_body", "truncate", "stall", "stall_headers"])
def test_s3_faults_while_reading_blocks_are_retried_without_changing_a_byte(world, tmp_path, fault):
    local, srv = world
    plain = ShardDataset(str(local), block_samples=32)
    ds = ShardDataset(URL, block_samples=32, cache_dir=str(tmp_path), request_timeout_s=1.0)
    srv.proxy.fail_next(fault, count=2, match="shard-", method="GET")
    try:
        start = time.monotonic()
        assert [ds[i] for i in range(len(ds))] == [plain[i] for i in range(len(plain))]
        assert srv.proxy.pending_faults() == 0 and ds.store.retries >= 2
        assert time.monotonic() - start < 20
    finally:
        srv.proxy.clear_faults()


@pytest.mark.slow
def test_a_data_server_retries_s3_faults_and_serves_the_same_batches(world, tmp_path):
    local, srv = world
    ref = reference(local)
    servers = serve(1, tmp_path, {**BASE, "shards": URL, "request_timeout_s": 2.0})
    try:
        srv.proxy.fail_next("503", count=3, match="shard-", method="GET")
        srv.proxy.fail_next("truncate", count=2, match="shard-", method="GET")
        ds = RemoteDataset([servers[0].address], TOKEN, seed=5)
        assert [batch_digest(b) for b in ds] == ref
        assert srv.proxy.pending_faults() == 0
    finally:
        srv.proxy.clear_faults()
        servers[0].shutdown(grace_s=1)


@pytest.mark.parametrize("url, message", [
    ("s3://no-such-bucket-here/train", "no-such-bucket-here"),
    (f"s3://{BUCKET}/not-prepared", "hetero prepare"),
])
def test_set_up_problems_fail_the_data_server_at_start_naming_the_fix(world, tmp_path, url, message):
    with pytest.raises(ConfigError, match=message):
        serve(1, tmp_path, {**BASE, "shards": url})


def test_access_denied_fails_at_start_naming_the_permission(world, tmp_path):
    _, srv = world
    srv.proxy.fail_next("403", count=1, match=INDEX_NAME)
    try:
        with pytest.raises(ConfigError, match="s3:GetObject"):
            ShardDataset(URL, cache_dir=str(tmp_path))
    finally:
        srv.proxy.clear_faults()


@pytest.mark.slow
def test_a_read_that_keeps_failing_reaches_the_consumer_naming_the_object(world, tmp_path):
    _, srv = world
    servers = serve(1, tmp_path, {**BASE, "shards": URL, "request_timeout_s": 0.2})
    try:
        srv.proxy.fail_next("503", count=100000, match="shard-", method="GET")
        ds = RemoteDataset([servers[0].address], TOKEN, seed=5, connect_timeout=10)
        start = time.monotonic()
        with pytest.raises(BatchBuildError, match=rf"s3://{BUCKET}/train/shard-") as err:
            list(ds)  # batch 0 was built at start-up (the probe), before the faults
        assert time.monotonic() - start < 30, "each read ends within its deadline"
        assert "epoch 0, batch" in str(err.value)
    finally:
        srv.proxy.clear_faults()
        servers[0].shutdown(grace_s=1)


def test_a_cache_smaller_than_a_block_fails_at_start_naming_both(world, tmp_path):
    with pytest.raises(ConfigError, match="shuffle block of 32 samples.*cache_bytes=1000"):
        ShardDataset(URL, block_samples=32, cache_dir=str(tmp_path), cache_bytes=1000)


@pytest.mark.slow  # a whole local job: two data nodes, a trainer (about 40 s)
def test_a_whole_local_job_trains_on_s3_shards_and_shuts_down_cleanly(world, tmp_path):
    from hetero.local import LocalJob, run_local

    hps = {"pipeline": PIPELINE, "pipeline.shards": URL, "pipeline.batch_size": 16, "pipeline.image_size": 32,
           "pipeline.shuffle_block": 32,  # 7 blocks of 2 batches
           "model": "examples.imagefolder:resnet18", "model.shards": URL,
           "step": "examples.imagefolder:train_step", "evaluate": "", "epochs": 2}
    audit = tmp_path / "audit.jsonl"
    result = run_local(LocalJob(output=tmp_path / "out", hyperparameters=hps, data_nodes=2, dnn_nodes=1,
                                audit=audit, timeout_s=240, echo=False))
    assert result.ok and set(result.exit_codes.values()) == {0}, result.exit_codes
    m = result.metrics
    assert m["steps"] == 2 * 12 and m["step_kind"] == "real"
    sent = [n["batches_sent"] for n in m["nodes"] if n["role"] == "data"]
    # Both nodes report; which one built a block is timing (a node slower to start under load has its
    # blocks built by the other), so only the total is a promise: more means hedged copies, dropped.
    assert len(sent) == 2 and sum(sent) >= 24, sent
    rows = read_audit(audit)
    assert sorted((x["epoch"], x["batch"]) for x in rows) == [(e, b) for e in range(2) for b in range(12)]


def _index_fetch(cache: str) -> None:
    from data_service.shards.indexfile import read_index

    index = read_index(URL, cache_dir=cache)
    assert len(index) == 200 and index.sample(len(index) - 1)


def test_the_index_is_fetched_from_s3_once_per_node_and_read_from_the_node_s_cache(world, tmp_path):
    import multiprocessing as mp

    local, srv = world
    size = (local / INDEX_NAME).stat().st_size
    key = f"/{BUCKET}/train/{INDEX_NAME}"
    srv.proxy.reset_counters()
    procs = [mp.get_context("fork").Process(target=_index_fetch, args=(str(tmp_path),)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    first = srv.proxy.counters()["path_bytes"][key]
    assert size <= first <= size + 3 * 2048  # the whole file once; each process reads its header
    assert list((tmp_path / "indexes").glob("index-*.bin"))
    srv.proxy.reset_counters()
    _index_fetch(str(tmp_path))  # cached on this node: the header, not the columns
    assert srv.proxy.counters()["path_bytes"][key] <= 2048 < size


def test_an_s3_index_with_a_header_longer_than_its_first_read_is_read_whole(world, tmp_path):
    import numpy as np

    from data_service.shards.format import ShardIndex, ShardInfo
    from data_service.shards.indexfile import read_index, write_index

    classes = [f"n{c:08d}-a-long-class-name" for c in range(1000)]  # a header of ~40 KB
    index = ShardIndex(classes, [ShardInfo("a/x.tar", 10_000, 0, 3)], np.array([512, 2048, 4096]),
                       np.array([100, 200, 300]), np.array([0, 999, 5]))
    write_index(S3Store(f"s3://{BUCKET}/many-classes"), index)
    back = read_index(f"s3://{BUCKET}/many-classes", cache_dir=str(tmp_path))
    assert back.classes == classes and back.sample(1) == (0, 2048, 200, 999)


def _index_with_a_long_sample(local: Path, dest: Path, block_samples: int) -> int:
    """Copy ``local``'s index.bin to ``dest`` with sample 0's length running 512 bytes past the range
    block 0 reads from its shard, yet inside the shard, over the samples after it (columns past the
    header are not checksummed when an index is opened): that sample."""
    import json
    import shutil
    import struct

    from data_service.shards.indexfile import PREFIX, _aligned, open_index_file

    index = open_index_file(str(local / INDEX_NAME))
    shard, start, stop = ShardDataset(str(local), block_samples=block_samples).block_parts(0)[0]
    assert index.shard_at(1) == shard and stop + 512 <= int(index.shards.sizes[shard])
    dest.mkdir()
    shutil.copy(local / INDEX_NAME, dest / INDEX_NAME)
    raw = (dest / INDEX_NAME).read_bytes()
    length = PREFIX.unpack(raw[:PREFIX.size])[2]
    header = json.loads(raw[PREFIX.size:PREFIX.size + length])
    at = _aligned(PREFIX.size + length) + int(header["columns"]["lengths"]["at"])
    with open(dest / INDEX_NAME, "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<I", stop - start + 512))
    return 0


def test_a_sample_over_its_neighbours_is_refused_naming_it_and_the_fix(world, tmp_path):
    """A damaged index entry running over the next samples' bytes never returns them: its checksum
    fails, naming the sample, the shard, the bytes, the sample it runs into and the fix, and reaches
    the consumer as a BatchBuildError; the sample it runs into reads its own bytes."""
    local, _ = world
    bad = _index_with_a_long_sample(local, tmp_path / "index", 32)
    ds = ShardDataset(URL, block_samples=32, cache_dir=str(tmp_path / "cache"), index=str(tmp_path / "index"))
    with pytest.raises(CorruptSampleError, match=rf"sample {bad} of shard s3://.*has CRC32C .*runs into sample "
                                                 rf"{bad + 1}.*the index is corrupt.*hetero index"):
        ds[bad]
    assert ds[bad + 1] == ShardDataset(str(local), block_samples=32)[bad + 1]
    os.environ["HETERO_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        consumer = LocalDataset(PipelineSpec(PIPELINE, {**BASE, "shards": URL, "index": str(tmp_path / "index")}),
                                seed=5)
        with pytest.raises(BatchBuildError, match=rf"sample {bad} .*runs into"):
            list(consumer)
    finally:
        os.environ.pop("HETERO_CACHE_DIR", None)
