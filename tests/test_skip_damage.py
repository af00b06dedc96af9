"""``on_corrupt=skip`` skips: a shard cut short under a running server and a corrupt index entry are
counted skips that keep every whole sample; a batch whose every sample was skipped names its shards.

The damage is done after the reader opened the data, as it would be under a running server: a
shard truncated in place (a folder), or put again shorter (S3), or an index entry pointing past
its shard's end.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from data_service import Pipeline, SkipSample
from data_service.contract.pipeline import PipelineSpec, SampleError, build_batch
from data_service.errors import BatchBuildError, ConfigError
from data_service.prepare.writer import prepare
from data_service.server import DataServer, ServerOptions
from data_service.shards import ShardDataset
from data_service.shards.checksum import CorruptSampleError
from data_service.shards.entries import CorruptEntryError
from data_service.shards.format import INDEX_NAME
from data_service.shards.indexfile import PREFIX, _aligned, read_index
from dnn_worker import LocalDataset, RemoteDataset

PIPELINE = "data_service.pipelines.images:build_pipeline"
BASE = {"batch_size": 8, "image_size": 32, "shuffle_block": 16, "drop_last": False}
BUCKET = "skip-tests"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    from hetero.synthetic.images import write_image_folder

    root = tmp_path_factory.mktemp("skips")
    write_image_folder(root / "src", per_class=20, classes=3, seed=3)
    prepare(str(root / "src"), str(root / "shards"), shard_size=1_000_000, workers=1, progress=False)
    return root / "shards"


def _copy(prepared: Path, dest: Path) -> Path:
    shutil.copytree(prepared, dest)
    return dest


def _cut_point(index, shard: int) -> tuple[int, list[int]]:
    """A byte in the middle of shard ``shard``'s middle sample, and the samples a cut there damages."""
    a, b = int(index.shards.first[shard]), int(index.shards.first[shard + 1])
    k = (a + b) // 2
    _, start, length, _ = index.sample(k)
    return start + length // 2, list(range(k, b))


def _poke(path: Path, column: str, i: int, value: int) -> None:
    raw = path.read_bytes()
    length = PREFIX.unpack(raw[:PREFIX.size])[2]
    col = json.loads(raw[PREFIX.size:PREFIX.size + length])["columns"][column]
    at = _aligned(PREFIX.size + length) + int(col["at"]) + i * np.dtype(col["dtype"]).itemsize
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(np.array([value], dtype=col["dtype"]).tobytes())


def _samples(dataset) -> int:
    return sum(len(b["label"]) for b in dataset)


def test_a_shard_cut_short_under_a_running_server_is_skipped_and_counted_keeping_the_samples_before(
        prepared, tmp_path):
    folder = _copy(prepared, tmp_path / "shards")
    index = read_index(str(folder))
    assert len(index.shards) >= 3
    at, damaged = _cut_point(index, 1)
    spec = PipelineSpec(PIPELINE, {**BASE, "shards": str(folder), "on_corrupt": "skip"})
    server = DataServer(spec, "tok", ServerOptions(num_workers=1)).start()
    try:
        ds = RemoteDataset([server.address], "tok", seed=0, connect_timeout=30.0, batch_timeout=60.0)
        assert _samples(ds) == len(index)  # epoch 0: the workers hold the shards open
        os.truncate(folder / index.shards.name(1), at)
        ds.set_epoch(1)
        assert _samples(ds) == len(index) - len(damaged)  # no error: every whole sample, the cut ones skipped
        snap = server.stats.snapshot()
        # counted per build: a batch the server built twice (a re-request) counts its skips twice
        assert len(damaged) <= snap.samples_skipped <= len(damaged) * (1 + snap.batches_built - snap.batches_sent)
    finally:
        server.shutdown(grace_s=2.0)


def test_a_cut_shard_fails_under_on_corrupt_fail_naming_the_shard_sample_and_both_sizes(prepared, tmp_path):
    folder = _copy(prepared, tmp_path / "shards")
    ds = ShardDataset(str(folder), block_samples=16)
    at, damaged = _cut_point(ds.index, 1)
    shard = folder / ds.index.shards.name(1)
    size = shard.stat().st_size
    os.truncate(shard, at)
    assert ds[damaged[0] - 1][0]  # the sample before the cut reads whole
    with pytest.raises(CorruptSampleError) as got:
        ds[damaged[0]]
    text = str(got.value)
    assert f"sample {damaged[0]} of shard {shard}" in text and f"holds {at} bytes now" in text
    assert f"the index says {size}" in text and "cut short" in text and "on_corrupt=skip" in text


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    from _s3_env import s3_with_bucket

    with s3_with_bucket(BUCKET) as srv:
        yield srv


def test_an_s3_shard_put_again_shorter_keeps_the_samples_before_the_cut(prepared, s3, tmp_path):
    from data_service.storage import S3Store

    store = S3Store(f"s3://{BUCKET}/cut")
    for p in sorted(prepared.iterdir()):
        store.write_bytes(p.name, p.read_bytes())
    ds = ShardDataset(store.url, block_samples=16, cache_dir=str(tmp_path / "cache"))  # a server opened it
    clean = ShardDataset(str(prepared), block_samples=16)
    at, damaged = _cut_point(ds.index, 1)
    name = ds.index.shards.name(1)
    store.write_bytes(name, (prepared / name).read_bytes()[:at])
    for i in range(len(ds)):
        if i in damaged:
            with pytest.raises(CorruptSampleError, match=rf"sample {i} of shard s3://{BUCKET}/cut/{name} .*cut short"):
                ds[i]
        else:
            assert ds[i] == clean[i], i
    assert ds._cut  # the blocks that meet the cut are read sample by sample, not cached


def test_an_index_offset_past_its_shard_s_end_is_one_counted_skip(prepared, tmp_path):
    folder = _copy(prepared, tmp_path / "shards")
    index = read_index(str(folder))
    size = int(index.shards.sizes[0])
    _poke(folder / INDEX_NAME, "offsets", 2, size + 4096)
    with pytest.raises(CorruptEntryError, match=rf"sample 2 \(offset {size + 4096}, .*past the end of shard"):
        ShardDataset(str(folder), block_samples=16)[2]
    dataset = LocalDataset(PipelineSpec(PIPELINE, {**BASE, "shards": str(folder), "on_corrupt": "skip"}), seed=0)
    assert _samples(dataset) == len(index) - 1
    assert dataset.pipeline().samples_skipped == 1


def test_an_overlapping_entry_of_a_checksummed_index_skips_the_sample_whose_bytes_are_not_its_own(
        prepared, tmp_path):
    folder = _copy(prepared, tmp_path / "shards")
    index = read_index(str(folder))
    _, start, length, _ = index.sample(2)
    _poke(folder / INDEX_NAME, "offsets", 3, start + length - 100)  # into sample 2's bytes: 2 runs into 3
    with pytest.raises(ConfigError, match="sample 2 of shard .* runs into sample 3"):
        read_index(str(folder)).check()  # a whole check (verify) refuses the overlap
    ds = ShardDataset(str(folder), block_samples=16)
    assert ds[2] == ShardDataset(str(prepared), block_samples=16)[2]  # the checksum clears sample 2
    with pytest.raises(CorruptSampleError, match=r"sample 3 of shard .*has CRC32C"):
        ds[3]
    dataset = LocalDataset(PipelineSpec(PIPELINE, {**BASE, "shards": str(folder), "on_corrupt": "skip"}), seed=0)
    assert _samples(dataset) == len(index) - 1
    assert dataset.pipeline().samples_skipped == 1


def test_a_batch_whose_every_sample_was_skipped_names_its_shards(prepared, tmp_path):
    folder = _copy(prepared, tmp_path / "shards")
    index = read_index(str(folder))
    dataset = LocalDataset(PipelineSpec(PIPELINE, {**BASE, "shards": str(folder), "on_corrupt": "skip"}), seed=0)
    dataset.pipeline()  # opened before the damage
    for k in range(len(index.shards)):
        os.truncate(folder / index.shards.name(k), 0)
    with pytest.raises(BatchBuildError) as got:
        _samples(dataset)
    text = str(got.value).split("--- original traceback")[0]
    assert "every one of the 8 samples of this batch was skipped" in text
    named = [k for k in range(len(index.shards)) if f"from {folder / index.shards.name(k)}" in text]
    assert named and "cut short" in text, text


def test_the_all_skipped_error_counts_the_samples_of_each_place():
    class Skipping:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            raise SkipSample(f"sample {i} unreadable", where=f"shard-{i % 2}.tar" if i < 5 else "")

    pipe = Pipeline(dataset=Skipping(), batch_size=6, shuffle=False)
    with pytest.raises(SampleError) as got:
        build_batch(pipe, pipe.epoch_shape(), 0, 0, 0)
    assert ("every one of the 6 samples of this batch was skipped (3 from shard-0.tar, 2 from shard-1.tar); "
            "the first: sample 0 unreadable") in str(got.value)
