"""Parquet data sets read in place: Hugging Face ``datasets``-style columns, row groups read once per
node into its cache, clear errors for columns that are missing, mistyped or do not decode."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_service.errors import ConfigError
from data_service.contract.pipeline import SkipSample, samples_reread
from data_service.shards.parquet import ParquetDataset, ParquetReadError
from data_service.shards.parquet_sums import PAGE_HEAD


def _rows(n: int, seed: int = 0) -> list[tuple[bytes, int]]:
    return [(hashlib.sha256(b"%d-%d" % (seed, i)).digest() * (1 + (i * 7 + seed) % 5), (i + seed) % 3)
            for i in range(n)]


def write_hf(path: Path, rows, row_group_size: int, names=("cat", "dog", "emu")) -> None:
    """A file as ``datasets`` exports it: image {bytes, path}, label int64 with ClassLabel names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"image": pa.array([{"bytes": b, "path": f"{i}.jpg"} for i, (b, _) in enumerate(rows)]),
                      "label": pa.array([y for _, y in rows], pa.int64())})
    features = {"image": {"_type": "Image"}, "label": {"names": list(names), "_type": "ClassLabel"}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    pq.write_table(table.replace_schema_metadata(meta), path, row_group_size=row_group_size,
                   write_page_checksum=True)


def test_hf_export_read_in_place_each_byte_once_then_from_the_node_cache(tmp_path):
    a, b = _rows(25), _rows(7, seed=1)
    write_hf(tmp_path / "data/part0/train-00000.parquet", a, 10)
    write_hf(tmp_path / "data/part1/train-00001.parquet", b, 3)  # files in path order
    ds = ParquetDataset(str(tmp_path / "data"), block_samples=8, cache_dir=str(tmp_path / "cache"))
    assert ds.classes == ["cat", "dog", "emu"] and len(ds) == 32
    assert [ds[i] for i in range(len(ds))] == a + b
    sizes = sum(size for _, size in ds.files)
    # footers (2 reads each), the first page header of each (page CRCs?), the row groups
    assert ds.store.bytes_read <= sizes + 2 * PAGE_HEAD and ds.store.requests == 2 * 2 + 2 + 3 + 3
    again = ParquetDataset(str(tmp_path / "data"), block_samples=8, cache_dir=str(tmp_path / "cache"))
    assert [again[i] for i in reversed(range(len(again)))] == list(reversed(a + b))
    assert again.store.requests == 0  # another process of the node: all from the cache
    assert list(ds.block_groups(1)) == [0, 1] and list(ds.block_groups(3)) == [2, 3, 4, 5]


def test_a_single_plain_file_and_labels_from_statistics(tmp_path):
    rows = _rows(9)
    pq.write_table(pa.table({"png": pa.array([r for r, _ in rows], pa.binary()),
                             "y": pa.array([y for _, y in rows], pa.int32())}), tmp_path / "one.parquet",
                   row_group_size=4)
    ds = ParquetDataset(str(tmp_path / "one.parquet"), image_column="png", label_column="y",
                        cache_dir=str(tmp_path / "cache"))
    assert ds.classes == ["0", "1", "2"] and [ds[i] for i in range(9)] == rows


def test_prefetch_brings_a_block_s_row_groups_into_the_cache_once(tmp_path):
    write_hf(tmp_path / "d.parquet", _rows(40), 8)
    side = ParquetDataset(str(tmp_path / "d.parquet"), block_samples=16, cache_dir=str(tmp_path / "c"))
    before = side.store.requests
    side.prefetch_block(1)
    side.prefetch_block(1)
    deadline = time.monotonic() + 20
    while not all(side.cache.files.cached(f"rg-{g:08d}.blk") for g in (2, 3)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert side.store.requests - before == 2
    worker = ParquetDataset(str(tmp_path / "d.parquet"), block_samples=16, cache_dir=str(tmp_path / "c"))
    assert [worker[i] for i in range(16, 32)] == _rows(40)[16:32] and worker.store.requests == 0


@pytest.mark.parametrize("image, label, match", [
    ("picture", "label", r"has no column 'picture' \(it has image \(struct<bytes: binary, path: string>\), label"),
    ("label", "label", "column 'image'|column 'label' is int64, not image bytes"),
    ("image", "image", "not integer labels"),
])
def test_a_missing_or_mistyped_column_is_a_clear_error_at_start(tmp_path, image, label, match):
    write_hf(tmp_path / "d.parquet", _rows(4), 2)
    with pytest.raises(ConfigError, match=match):
        ParquetDataset(str(tmp_path / "d.parquet"), image_column=image, label_column=label,
                       cache_dir=str(tmp_path / "c"))


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d/x.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ConfigError, match=r"x.parquet is not a Parquet file \(no PAR1 at its end\)"):
        ParquetDataset(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"))
    with pytest.raises(ConfigError, match="no .parquet files there"):
        ParquetDataset(str(tmp_path / "c"), cache_dir=str(tmp_path / "c2"))


@pytest.mark.parametrize("on_corrupt", ["fail", "skip"])
def test_a_row_group_that_does_not_decode_fails_or_is_skipped_and_is_read_once(tmp_path, on_corrupt):
    rows = _rows(12)
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"image": pa.array([r for r, _ in rows], pa.binary()),
                             "label": pa.array([y for _, y in rows], pa.int64())}), path, row_group_size=4,
                   compression="snappy", use_dictionary=False)
    meta = pq.read_metadata(path)
    chunk = meta.row_group(1).column(0)
    raw = bytearray(path.read_bytes())
    at = chunk.data_page_offset + 3
    raw[at:at + 24] = b"\xff" * 24  # the page header of row group 1's image column
    path.write_bytes(bytes(raw))
    ds = ParquetDataset(str(path), on_corrupt=on_corrupt, cache_dir=str(tmp_path / "c"))
    assert [ds[i] for i in range(4)] == rows[:4] and [ds[i] for i in range(8, 12)] == rows[8:]
    before = ds.store.requests
    for i in range(4, 8):
        if on_corrupt == "skip":
            with pytest.raises(SkipSample, match=f"sample {i}: .*d.parquet row group 1 .*cannot be read"):
                ds[i]
        else:
            with pytest.raises(ParquetReadError, match="row group 1 .* pass pipeline.on_corrupt=skip"):
                ds[i]
    assert ds.store.requests - before == 1  # the broken row group was read once, its failure kept


@pytest.mark.parametrize("on_corrupt", ["fail", "skip"])
def test_a_row_without_a_label_fails_or_is_skipped(tmp_path, on_corrupt):
    pq.write_table(pa.table({"image": pa.array([b"a", b"b", b"c"], pa.binary()),
                             "label": pa.array([0, None, 1], pa.int64())}), tmp_path / "d.parquet")
    ds = ParquetDataset(str(tmp_path / "d.parquet"), on_corrupt=on_corrupt, cache_dir=str(tmp_path / "c"))
    assert ds[0] == (b"a", 0) and ds[2] == (b"c", 1)
    with pytest.raises(SkipSample if on_corrupt == "skip" else ParquetReadError, match="row 1 has no label"):
        ds[1]


def test_a_large_row_group_is_read_in_ranges_each_byte_once(tmp_path):
    rows = [(hashlib.sha256(b"%d" % i).digest() * 1000, i % 2) for i in range(10)]  # 32 KB each
    pq.write_table(pa.table({"image": pa.array([b for b, _ in rows], pa.binary()),
                             "label": pa.array([y for _, y in rows], pa.int64())}), tmp_path / "d.parquet",
                   row_group_size=10, compression="none", use_dictionary=False)
    ds = ParquetDataset(str(tmp_path / "d.parquet"), range_bytes=64 << 10, cache_dir=str(tmp_path / "c"))
    before = ds.store.requests, ds.store.bytes_read
    assert [ds[i] for i in range(10)] == rows
    span = int(ds.spans[0][1] - ds.spans[0][0])
    assert ds.store.requests - before[0] == -(-span // (64 << 10)) and ds.store.bytes_read - before[1] == span


def test_a_file_written_again_is_read_again(tmp_path):
    def write(fill: bytes) -> int:
        (tmp_path / "d").mkdir(exist_ok=True)
        pq.write_table(pa.table({"image": pa.array([fill * 64] * 3, pa.binary()), "label": pa.array([0, 1, 2])}),
                       tmp_path / "d/a.parquet", compression="none", use_dictionary=False, write_statistics=False)
        return (tmp_path / "d/a.parquet").stat().st_size

    size = write(b"x")
    assert ParquetDataset(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"))[0] == (b"x" * 64, 0)
    assert write(b"y") == size  # the same size, other bytes
    assert ParquetDataset(str(tmp_path / "d"), cache_dir=str(tmp_path / "c"))[0] == (b"y" * 64, 0)


def test_null_images_large_binary_and_a_sliced_struct(tmp_path):
    images = pa.array([{"bytes": b"aa", "path": "x"}, None, {"bytes": None, "path": "y"}, {"bytes": b"d", "path": ""}])
    pq.write_table(pa.table({"image": images, "label": pa.array([0, 1, 2, 3])}), tmp_path / "s.parquet")
    pq.write_table(pa.table({"image": pa.array([b"x" * 5, None, b"yz"], pa.large_binary()),
                             "label": pa.array([1, 0, 1])}), tmp_path / "t.parquet")
    s = ParquetDataset(str(tmp_path / "s.parquet"), cache_dir=str(tmp_path / "c"))
    t = ParquetDataset(str(tmp_path / "t.parquet"), cache_dir=str(tmp_path / "c"))
    assert [s[i] for i in range(4)] == [(b"aa", 0), (b"", 1), (b"", 2), (b"d", 3)]  # empty: the pipeline's on_corrupt
    assert [t[i] for i in range(3)] == [(b"xxxxx", 1), (b"", 0), (b"yz", 1)]


def _with_page_crcs(path: Path, rows) -> None:
    """Uncompressed plain pages with CRCs: a flipped byte of a value changes that value and nothing else."""
    pq.write_table(pa.table({"image": pa.array([r for r, _ in rows], pa.binary()),
                             "label": pa.array([y for _, y in rows], pa.int64())}), path, row_group_size=4,
                   compression="none", use_dictionary=False, write_statistics=False, write_page_checksum=True)


def _flip_in_value(path: Path, rows, sample: int) -> int:
    """Flip one byte of sample ``sample``'s image bytes in the file; the byte offset."""
    raw = bytearray(path.read_bytes())
    at = raw.index(rows[sample][0]) + 5
    raw[at] ^= 0x20
    path.write_bytes(bytes(raw))
    return at


@pytest.mark.parametrize("on_corrupt", ["fail", "skip"])
def test_a_flipped_byte_in_a_page_is_detected_named_and_read_twice_from_the_source(tmp_path, on_corrupt):
    rows = _rows(12)
    path = tmp_path / "d.parquet"
    _with_page_crcs(path, rows)
    _flip_in_value(path, rows, 5)
    ds = ParquetDataset(str(path), on_corrupt=on_corrupt, cache_dir=str(tmp_path / "c"))
    assert [ds[i] for i in range(4)] == rows[:4] and [ds[i] for i in range(8, 12)] == rows[8:]
    before, reread = ds.store.requests, samples_reread()
    for i in range(4, 8):  # the whole page is refused: no row of it reaches training
        with pytest.raises(SkipSample if on_corrupt == "skip" else ParquetReadError,
                           match=r"d.parquet row group 1 \(samples 4..7\).*a page fails its CRC, read twice from "
                                 r"the source"):
            ds[i]
    assert ds.store.requests - before == 2 and samples_reread() - reread == 1  # read again once, then the failure kept


def test_a_flipped_byte_in_the_node_s_cached_row_group_is_dropped_and_decoded_again(tmp_path):
    rows = _rows(12)
    _with_page_crcs(tmp_path / "d.parquet", rows)
    ds = ParquetDataset(str(tmp_path / "d.parquet"), cache_dir=str(tmp_path / "c"))
    assert ds[5] == rows[5]
    cached = Path(ds.cache.files.path("rg-00000001.blk"))
    for at in (cached.stat().st_size - 3, 16 + 8 * 5 + 2, 16 + 8 * 5 + 8 * 5):  # image bytes, offsets, labels
        raw = bytearray(cached.read_bytes())
        raw[at] ^= 0x01
        cached.write_bytes(bytes(raw))
        fresh = ParquetDataset(str(tmp_path / "d.parquet"), cache_dir=str(tmp_path / "c"))  # another worker
        before, reread = fresh.store.requests, samples_reread()
        assert [fresh[i] for i in range(4, 8)] == rows[4:8]
        assert samples_reread() - reread == 1 and fresh.store.requests - before == 1  # dropped, read from the source once

