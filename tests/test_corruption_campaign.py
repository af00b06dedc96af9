"""The corruption campaign in small (benchmarks/corruption.py), and the index check it led to."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _old_index import as_version_3

from benchmarks import corruption
from benchmarks.common import corrupt as cc
from data_service.errors import ConfigError
from data_service.shards import ShardDataset
from data_service.shards.indexfile import PREFIX


@pytest.mark.slow
def test_damaged_shards_cache_blocks_and_data_plane_never_train_silently_and_lose_no_whole_sample(tmp_path):
    trace: list[dict] = []
    table = corruption.run(6, seed=5, images=48, work=str(tmp_path), only=("local", "cache", "dataplane"),
                           trace=trace)
    assert table["total"]["trials"] == 6
    assert table["total"]["silent"] == 0 and table["total"]["lost"] == 0, trace
    assert table["dataplane"]["silent"] == 0 and table["dataplane"]["trials"] > 0, trace
    # every cache flip lands in a sample's bytes: the block is dropped and S3 read again, which the
    # servers' samples_reread stat shows
    assert table["cache"]["reread"] == table["cache"]["trials"] > 0, trace


@pytest.mark.slow
def test_damaged_decoded_cache_entries_and_plain_parquet_rows_never_train_silently(tmp_path):
    trace: list[dict] = []
    table = corruption.run(4, seed=7, images=48, work=str(tmp_path), only=("decoded", "parquet-plain"), trace=trace)
    assert table["total"]["silent"] == 0 and table["total"]["lost"] == 0, trace
    # every damaged entry is read (every image, every epoch), fails its CRC32C and is decoded again
    assert table["decoded"]["reread"] == table["decoded"]["trials"] > 0, trace
    assert table["parquet-plain"]["trials"] > 0, trace


@pytest.mark.slow
def test_shards_cut_short_under_running_servers_are_counted_skips_that_keep_every_whole_sample(tmp_path):
    trace: list[dict] = []
    # A cut the servers had read past already is harmless; on a loaded machine 4 trials may all be,
    # so more rounds run (other seeds) until one cut is met, each round held to the same rules.
    for round_seed in (3, 4, 5):
        (tmp_path / str(round_seed)).mkdir()
        table = corruption.run(4, seed=round_seed, images=48, work=str(tmp_path / str(round_seed)),
                               only=("running",), trace=trace)
        row = table["running"]
        assert row["trials"] == 4 and row["silent"] == 0 and row["lost"] == 0, trace
        # skip means skip: no epoch stopped, but by a batch whose every sample lay past the cut (named)
        assert all(r["emptied"] and "shard-" in r["error"] for r in trace if r["error"]), trace
        if any(r["skipped"] for r in trace):
            break
    assert any(r["skipped"] for r in trace), trace  # a cut was met, and counted


def _shards(tmp_path) -> str:
    cc.photos(str(tmp_path / "photos"), 12)
    return cc.prepared(str(tmp_path / "photos"), str(tmp_path / "shards"))


def _labels_at(folder: str) -> int:
    """Where index.bin's labels column starts."""
    with open(os.path.join(folder, "index.bin"), "rb") as f:
        length = PREFIX.unpack(f.read(PREFIX.size))[2]
        header = json.loads(f.read(length))
    return -(-(PREFIX.size + length) // 64) * 64 + int(header["columns"]["labels"]["at"])


def test_a_label_flipped_in_a_version_3_index_bin_is_refused_at_open_naming_the_index(tmp_path):
    shards = _shards(tmp_path)
    as_version_3(Path(shards))  # its checksums cover the bytes alone (version 4's cover each label: read checks it)
    clean = ShardDataset(shards, cache_dir=str(tmp_path / "c0"))
    label = clean[3][1]
    path = tmp_path / "shards" / "index.bin"
    raw = bytearray(path.read_bytes())
    at = _labels_at(shards) + 4 * 3
    raw[at] = 1 - label if label in (0, 1) else 0  # another class, still within range: nothing else would see it
    path.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match=r"index.bin: its labels column has CRC-32 \w+, its header says \w+: "
                                          r"the index was damaged .* `hetero prepare`"):
        ShardDataset(shards, cache_dir=str(tmp_path / "c1"))


def test_the_version_3_label_check_runs_once_per_node_and_again_for_a_file_written_again(tmp_path):
    shards = _shards(tmp_path)
    ShardDataset(shards, cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "c" / "checked").exists()  # version 4: no pass at open, each read checks its label
    as_version_3(Path(shards))
    ShardDataset(shards, cache_dir=str(tmp_path / "c"))
    assert len(os.listdir(tmp_path / "c" / "checked")) == 1
    ShardDataset(shards, cache_dir=str(tmp_path / "c"))  # another process of the node: the marker says checked
    assert len(os.listdir(tmp_path / "c" / "checked")) == 1
    os.utime(os.path.join(shards, "index.bin"), ns=(1, 1))  # the file changed: checked again
    ShardDataset(shards, cache_dir=str(tmp_path / "c"))
    assert len(os.listdir(tmp_path / "c" / "checked")) == 2


@pytest.mark.slow
def test_labels_changed_in_a_manifest_or_under_running_servers_never_train_silently(tmp_path):
    trace: list[dict] = []
    table = corruption.run(4, seed=3, images=24, work=str(tmp_path), only=("label_manifest", "label_index"),
                           trace=trace)
    assert table["label_manifest"]["trials"] == table["label_index"]["trials"] == 2, trace
    assert table["total"]["detected"] == 4 and table["total"]["lost"] == 0, trace
    # the first manifest trial is named at the merge, the second (its own checksum made to match) at the read
    manifest = [r for r in trace if r["place"] == "label_manifest"]
    assert "fails its checksum" in manifest[0]["error"] and "fails its checksum" not in manifest[1]["error"], manifest


@pytest.mark.slow
def test_damaged_requests_never_train_silently_nor_stall(tmp_path):
    trace: list[dict] = []
    table = corruption.run(6, seed=2, images=48, work=str(tmp_path), only=("request",), trace=trace)
    assert table["request"]["trials"] == 6 and table["request"]["silent"] == 0 and table["request"]["lost"] == 0, trace
    # a damaged request is asked again at once: no trial waits out the consumer's batch_timeout (20 s)
    assert all(r["seconds"] < 20 / 2 for r in trace), [r["seconds"] for r in trace]
