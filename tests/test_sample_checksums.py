"""Per-sample CRC32C checksums: a byte flipped between a shard and a data worker is named, never trained on.

``hetero prepare``, ``hetero index`` and ``hetero index --from-json`` write a checksum per sample
over its bytes and label (tests/test_label_checksums.py); a flipped byte in a local shard is an error naming the shard, sample, byte
range and both checksums, or (``on_corrupt=skip``) a counted skip; a flipped byte in the S3 block
cache is dropped and read again from S3 (counted), one in the S3 object itself is named; an
index.bin without checksums still reads and says once per process that samples are unchecked.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from data_service.contract.pipeline import PipelineSpec, samples_reread
from data_service.shards import ShardDataset
from data_service.shards.checksum import CorruptSampleError
from data_service.shards.format import INDEX_NAME
from data_service.shards.indexfile import IndexWriter, open_index_file, read_index
from data_service.prepare.writer import prepare
from dnn_worker import LocalDataset

PIPELINE = "data_service.pipelines.images:build_pipeline"
BASE = {"batch_size": 8, "image_size": 32, "shuffle_block": 16, "interleave": 2, "drop_last": False}
BUCKET = "checksum-tests"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    from hetero.synthetic.images import write_image_folder

    root = tmp_path_factory.mktemp("checksums")
    write_image_folder(root / "src", per_class=20, classes=3, seed=2)
    prepare(str(root / "src"), str(root / "shards"), shard_size=1_000_000, workers=1, progress=False)
    return root / "shards"


def _copy(prepared: Path, dest: Path) -> Path:
    shutil.copytree(prepared, dest)
    return dest


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.mark.parametrize("on_corrupt", ["fail", "skip"])
def test_a_flipped_byte_in_a_local_shard_is_named_or_skipped_and_counted(prepared, tmp_path, on_corrupt):
    folder = _copy(prepared, tmp_path / "shards")
    index = read_index(str(folder))
    shard, start, length, _ = index.sample(5)
    _flip(folder / index.shards.name(shard), start + length // 2)
    ds = ShardDataset(str(folder), block_samples=16)
    if on_corrupt == "fail":
        with pytest.raises(CorruptSampleError) as got:
            ds[5]
        text = str(got.value)
        assert f"sample 5 of shard {folder / index.shards.name(shard)} (bytes {start}..{start + length})" in text
        assert f"the index says {index.checksum(5):08x}" in text and "on_corrupt=skip" in text
    options = {**BASE, "shards": str(folder), "on_corrupt": on_corrupt}
    dataset = LocalDataset(PipelineSpec(PIPELINE, options), seed=0)
    if on_corrupt == "skip":
        assert sum(len(b["label"]) for b in dataset) == len(index) - 1
        assert dataset.pipeline().samples_skipped == 1
    else:
        with pytest.raises(Exception, match=r"sample 5 of shard .*has CRC32C [0-9a-f]{8}, the index says"):
            sum(len(b["label"]) for b in dataset)


def test_an_index_without_checksums_reads_and_says_once_that_samples_are_unchecked(prepared, tmp_path, caplog):
    folder = _copy(prepared, tmp_path / "old")
    index = read_index(str(folder))
    with IndexWriter(str(folder)) as w:  # as an earlier release wrote it: version 2, no checksums
        for k in range(len(index.shards)):
            a, b = int(index.shards.first[k]), int(index.shards.first[k + 1])
            w.add_shard(index.shards.name(k), int(index.shards.sizes[k]), index.offsets[a:b], index.lengths[a:b],
                        index.labels[a:b])
        w.write_file(str(folder / INDEX_NAME), index.classes)
    with open(folder / INDEX_NAME, "rb") as f:
        assert f.read(12)[8:] == (2).to_bytes(4, "little")
    assert open_index_file(str(folder / INDEX_NAME)).checksums is None
    plain = ShardDataset(str(prepared), block_samples=16)
    with caplog.at_level(logging.WARNING, logger="data_service.shards.checksum"):
        for _ in range(2):
            ds = ShardDataset(str(folder), block_samples=16)
            assert [ds[i] for i in range(len(ds))] == [plain[i] for i in range(len(plain))]
    said = [r.getMessage() for r in caplog.records if "no per-sample checksums" in r.getMessage()]
    assert len(said) == 1 and f"`hetero index --upgrade {folder}`" in said[0], said


def test_a_version_this_release_does_not_know_is_refused_naming_both(prepared, tmp_path):
    folder = _copy(prepared, tmp_path / "new")
    with open(folder / INDEX_NAME, "r+b") as f:
        f.seek(8)
        f.write((5).to_bytes(4, "little"))
    with pytest.raises(Exception, match="index.bin version 5; this release reads versions 2, 3, 4"):
        read_index(str(folder))


@pytest.fixture(scope="module")
def s3(prepared):
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    from _s3_env import s3_with_bucket
    from data_service.storage import S3Store

    with s3_with_bucket(BUCKET) as srv:
        yield srv, S3Store


def _upload(s3, prepared: Path, prefix: str, flip_sample: int | None = None) -> str:
    _, S3Store = s3
    store = S3Store(f"s3://{BUCKET}/{prefix}")
    index = read_index(str(prepared))
    bad = None if flip_sample is None else index.sample(flip_sample)
    for p in sorted(prepared.iterdir()):
        raw = bytearray(p.read_bytes())
        if bad is not None and p.name == index.shards.name(bad[0]):
            raw[bad[1] + bad[2] // 2] ^= 0x10
        store.write_bytes(p.name, bytes(raw))
    return store.url


def test_a_flipped_byte_in_the_s3_block_cache_is_dropped_and_read_again_from_s3(s3, prepared, tmp_path):
    url = _upload(s3, prepared, "good")
    plain = ShardDataset(str(prepared), block_samples=16)
    ds = ShardDataset(url, block_samples=16, cache_dir=str(tmp_path))
    assert ds[3] == plain[3]  # block 0 now cached
    shard, start, length, _ = ds.index.sample(3)
    part_start, _, pos = ds._node.entry(0, ds._open_block)[1][shard]
    _flip(Path(ds.cache.files.path(ds._name(0))), pos + start - part_start + length // 2)
    other = ShardDataset(url, block_samples=16, cache_dir=str(tmp_path))  # another worker of the node
    reread = samples_reread()
    assert other[3] == plain[3] and samples_reread() - reread == 1
    assert [other[i] for i in range(16)] == [plain[i] for i in range(16)] and samples_reread() - reread == 1


def test_a_flipped_byte_in_the_s3_object_is_named(s3, prepared, tmp_path):
    url = _upload(s3, prepared, "bad", flip_sample=7)
    ds = ShardDataset(url, block_samples=16, cache_dir=str(tmp_path))
    index = ds.index
    shard, start, length, _ = index.sample(7)
    reread = samples_reread()
    with pytest.raises(CorruptSampleError, match=rf"sample 7 of shard {url.rstrip('/')}/{index.shards.name(shard)} "
                                                  rf"\(bytes {start}..{start + length}\) has CRC32C [0-9a-f]{{8}}, "
                                                  rf"the index says {index.checksum(7):08x}, read twice"):
        ds[7]
    assert samples_reread() - reread == 1
