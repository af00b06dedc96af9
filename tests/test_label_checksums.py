"""A sample's checksum covers its label: a label flipped anywhere between ``hetero prepare`` and a data
worker is named, never trained on.

``hetero prepare`` (its part manifests carry a checksum of their own, checked at ``--merge``),
``hetero index`` and ``hetero index --from-json`` write each sample's CRC32C over its bytes and
then its label; a data worker checks it on every read, so a label that rots in index.bin after a
node opened it is named at the next read. An index.bin whose checksums cover the bytes alone still
reads and says once what is unchecked and which command adds it.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from _old_index import as_version_3
from hypothesis import given, settings
from hypothesis import strategies as st

from data_service.contract.pipeline import PipelineSpec, samples_reread
from data_service.errors import ConfigError
from data_service.prepare.plan import manifest_key
from data_service.prepare.writer import merge_parts, prepare
from data_service.shards import ShardDataset
from data_service.shards.checksum import CorruptSampleError, crc32c
from data_service.shards.format import INDEX_NAME, JSON_INDEX_NAME
from data_service.shards.indexfile import PREFIX, _aligned, read_index, verify
from data_service.shards.wds_index import index_tars
from dnn_worker import LocalDataset
from hetero.cli import main

PIPELINE = "data_service.pipelines.images:build_pipeline"


def _label_crc(data: bytes, label: int) -> int:
    """What a sample's checksum is: CRC32C over its bytes, then its label as index.bin stores it (<i4)."""
    return crc32c(int(label).to_bytes(4, "little", signed=True), crc32c(data))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    from hetero.synthetic.images import write_image_folder

    root = tmp_path_factory.mktemp("labels") / "src"
    write_image_folder(root, per_class=20, classes=3, seed=2)  # 60 JPEGs: 2 shards of about 1 MB, labels 0..2
    return root


@pytest.fixture(scope="module")
def parts(source, tmp_path_factory) -> Path:
    """Both parts of a run written, not merged: the shards and their manifests, as --merge finds them."""
    dest = tmp_path_factory.mktemp("labels") / "parts"
    for part in ("0/2", "1/2"):
        prepare(str(source), str(dest), shard_size=1_000_000, workers=1, progress=False, part=part)
    return dest


@pytest.fixture(scope="module")
def prepared(parts, tmp_path_factory) -> Path:
    """The parts merged: what a single ``hetero prepare`` run writes."""
    dest = _copy(parts, tmp_path_factory.mktemp("labels") / "shards")
    merge_parts(str(dest))
    return dest


def _copy(prepared: Path, dest: Path) -> Path:
    shutil.copytree(prepared, dest)
    return dest


def _label_at(folder: Path, i: int) -> int:
    """Where sample ``i``'s label lies in ``folder``'s index.bin."""
    raw = (folder / INDEX_NAME).read_bytes()
    length = PREFIX.unpack(raw[:PREFIX.size])[2]
    col = json.loads(raw[PREFIX.size:PREFIX.size + length])["columns"]["labels"]
    return _aligned(PREFIX.size + length) + int(col["at"]) + 4 * i


def _rot_label(folder: Path, i: int, label: int) -> int:
    """Sample ``i``'s label changed in place in index.bin to another class (as rot on the disk would); the new one."""
    new = (label + 1) % 3
    path = folder / INDEX_NAME
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(_label_at(folder, i))
        f.write(int(new).to_bytes(4, "little", signed=True))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # rot leaves the file's size, time and inode as they were
    return new


def _all_cover_labels(folder: Path, index_folder: Path | None = None) -> None:
    index = verify(str((index_folder or folder) / INDEX_NAME))
    for i in range(len(index)):
        shard, start, length, label = index.sample(i)
        with open(folder / index.shards.name(shard), "rb") as f:
            f.seek(start)
            assert index.checksum(i) == _label_crc(f.read(length), label), i


def test_prepare_index_and_from_json_write_checksums_over_bytes_and_label(prepared, tmp_path):
    _all_cover_labels(prepared)
    index_tars(str(prepared), str(tmp_path / "wds"))  # the tars as if written elsewhere: labels from .cls
    _all_cover_labels(prepared, tmp_path / "wds")
    old = _copy(prepared, tmp_path / "json")
    (old / JSON_INDEX_NAME).write_bytes(read_index(str(prepared)).to_json())
    os.unlink(old / INDEX_NAME)
    assert main(["index", "--from-json", str(old)]) == 0
    _all_cover_labels(old)


def test_a_label_that_rots_in_index_bin_after_a_node_opened_it_is_named_at_the_next_read(prepared, tmp_path):
    folder = _copy(prepared, tmp_path / "rot")
    cache = str(tmp_path / "cache")
    ds = ShardDataset(str(folder), block_samples=8, cache_dir=cache)
    data, label = ds[5]  # the node opened the index and read the sample: every check passed
    reread = samples_reread()
    new = _rot_label(folder, 5, label)
    for reader in (ds, ShardDataset(str(folder), block_samples=8, cache_dir=cache)):  # this process, and another
        with pytest.raises(CorruptSampleError) as got:
            reader[5]
        text = str(got.value)
        assert f"sample 5 of shard {folder / 'shard-000000.tar'}" in text and f"label {new}" in text, text
        assert f"its bytes with label {label}" in text and INDEX_NAME in text and "hetero index" in text, text
        assert reader[4][1] == ds[4][1]  # its neighbours still read
    assert samples_reread() == reread  # the bytes are good: nothing read again from the source


def test_with_on_corrupt_skip_a_rotten_label_is_a_counted_skip(prepared, tmp_path):
    folder = _copy(prepared, tmp_path / "skip")
    index = read_index(str(folder))
    _rot_label(folder, 3, int(index.labels[3]))
    options = {"batch_size": 8, "image_size": 32, "shuffle_block": 8, "drop_last": False,
               "shards": str(folder), "on_corrupt": "skip"}
    dataset = LocalDataset(PipelineSpec(PIPELINE, options), seed=0)
    assert sum(len(b["label"]) for b in dataset) == len(index) - 1
    assert dataset.pipeline().samples_skipped == 1


def _flip_manifest_label(dest: Path, reseal: bool = False) -> tuple[str, int]:
    """A label of shard 0's manifest changed to another class; with ``reseal`` its own checksum made
    to match (damage the manifest's checksum cannot see). The manifest's path and the sample."""
    path = dest / manifest_key(0)
    doc = json.loads(path.read_bytes())
    doc["labels"][2] = (doc["labels"][2] + 1) % 3
    if reseal and "crc32c_manifest" in doc:
        from data_service.prepare.plan import seal

        doc = json.loads(seal({k: v for k, v in doc.items() if k != "crc32c_manifest"}))
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return str(path), 2


def test_a_label_flipped_in_a_part_manifest_before_merge_is_named_not_trained(parts, tmp_path):
    dest = _copy(parts, tmp_path / "parts")
    path, _ = _flip_manifest_label(dest)
    with pytest.raises(ConfigError, match=rf"{path} .*fails its checksum.*delete it and run that part again"):
        merge_parts(str(dest))
    assert not (dest / INDEX_NAME).exists()


def test_a_manifest_label_flip_its_own_checksum_misses_is_named_at_read(parts, tmp_path):
    dest = _copy(parts, tmp_path / "parts")
    _, i = _flip_manifest_label(dest, reseal=True)
    merge_parts(str(dest))
    ds = ShardDataset(str(dest), block_samples=8, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(CorruptSampleError, match=rf"sample {i} of shard .*shard-000000.tar.*label"):
        ds[i]


def test_a_manifest_without_its_own_checksum_is_refused_at_merge(parts, tmp_path):
    dest = _copy(parts, tmp_path / "parts")
    path = dest / manifest_key(1)
    doc = json.loads(path.read_bytes())
    doc.pop("crc32c_manifest", None)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=rf"{path} .*no checksum of its own.*delete it and run that part again"):
        merge_parts(str(dest))


def test_an_index_whose_checksums_cover_bytes_alone_reads_says_so_once_and_upgrade_adds_labels(
        prepared, tmp_path, caplog):
    folder = _copy(prepared, tmp_path / "v3")
    as_version_3(folder)
    with open(folder / INDEX_NAME, "rb") as f:
        assert f.read(12)[8:] == (3).to_bytes(4, "little")
    plain = ShardDataset(str(prepared), block_samples=8, cache_dir=str(tmp_path / "c0"))
    with caplog.at_level(logging.WARNING, logger="data_service.shards.checksum"):
        for _ in range(2):
            ds = ShardDataset(str(folder), block_samples=8, cache_dir=str(tmp_path / "c1"))
            assert [ds[i] for i in range(len(ds))] == [plain[i] for i in range(len(plain))]
    said = [r.getMessage() for r in caplog.records if "not their labels" in r.getMessage()]
    assert len(said) == 1 and f"hetero index --upgrade {folder}" in said[0], said
    assert main(["index", "--upgrade", str(folder)]) == 0
    _all_cover_labels(folder)
    assert read_index(str(folder)).id == read_index(str(prepared)).id  # the same index a fresh prepare writes


def test_upgrade_refuses_an_index_whose_labels_column_is_already_damaged(prepared, tmp_path, capsys):
    folder = _copy(prepared, tmp_path / "bad")
    as_version_3(folder)
    _rot_label(folder, 1, int(read_index(str(folder)).labels[1]))
    assert main(["index", "--upgrade", str(folder)]) == 2
    assert "labels is corrupt" in "".join(capsys.readouterr())


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(-2**31, 2**31 - 1), st.integers(-2**31, 2**31 - 1))
def test_any_change_of_a_label_changes_the_checksum_and_the_label_is_recovered_from_it(crc, a, b):
    from data_service.shards.checksum import label_of, sample_crc, sample_crcs

    assert (sample_crc(crc, a) == sample_crc(crc, b)) == (a == b)
    assert label_of(crc, sample_crc(crc, a)) == a
    got = sample_crcs(np.array([crc, crc], dtype="<u4"), np.array([a, b], dtype="<i4"))
    assert list(got) == [sample_crc(crc, a), sample_crc(crc, b)]


def test_upgrade_rewrites_an_s3_index_and_its_reads_then_check_labels(prepared, tmp_path):
    pytest.importorskip("moto.server")
    from _s3_env import s3_with_bucket
    from data_service.storage import S3Store

    folder = _copy(prepared, tmp_path / "v3")
    as_version_3(folder)
    with s3_with_bucket("label-upgrade"):
        store = S3Store("s3://label-upgrade/train")
        for p in sorted(folder.iterdir()):
            store.write_bytes(p.name, p.read_bytes())
        assert main(["index", "--upgrade", store.url]) == 0
        ds = ShardDataset(store.url, block_samples=8, cache_dir=str(tmp_path / "cache"))
        index = read_index(str(prepared))
        assert ds.index.id == index.id and [ds[i][1] for i in range(len(ds))] == [int(x) for x in index.labels]
