"""Parquet as users write it (no page CRCs): the row checksums ``hetero index`` writes, checked on
every read; without them a notice per file, or a refusal with ``unchecked="refuse"``."""
from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_service.contract.pipeline import PipelineSpec, SkipSample, samples_reread
from data_service.errors import ConfigError
from data_service.shards import parquet_sums as ps
from data_service.shards.parquet import ParquetDataset, ParquetReadError
from data_service.shards.parquet_sums import index_parquet
from hetero.cli import main as hetero

LOG = "data_service.shards.parquet_sums"


def _rows(n: int, seed: int = 0) -> list[tuple[bytes, int]]:
    return [(hashlib.sha256(b"%d-%d" % (seed, i)).digest() * (2 + (i * 7 + seed) % 5), (i + seed) % 3)
            for i in range(n)]


def _plain(path: Path, rows, **kw) -> Path:
    """As pyarrow writes by default, without page CRCs (uncompressed here: a flipped byte of a value
    changes that value and nothing else, as it does in the incompressible JPEG bytes of a real file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"row_group_size": 4, "compression": "none", "use_dictionary": False, **kw}
    pq.write_table(pa.table({"image": pa.array([r for r, _ in rows], pa.binary()),
                             "label": pa.array([y for _, y in rows], pa.int64())}), path, **options)
    return path


def _flip(path: Path, needle: bytes, plus: int = 5, mask: int = 0x20) -> None:
    raw = bytearray(path.read_bytes())
    raw[raw.index(needle) + plus] ^= mask
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("on_corrupt", ["fail", "skip"])
def test_a_flipped_image_byte_in_a_file_without_page_crcs_is_caught_by_the_row_checksums(tmp_path, on_corrupt):
    rows = _rows(12)
    path = _plain(tmp_path / "d.parquet", rows)
    summary = index_parquet(str(path))
    assert summary.rows == 12 and summary.page_crcs == 0 and (tmp_path / "d.parquet.crc32c").exists()
    _flip(path, rows[5][0])  # sample 5's image bytes: without the checksums, it trained as other bytes
    ds = ParquetDataset(str(path), on_corrupt=on_corrupt, cache_dir=str(tmp_path / "c"))
    before, reread = ds.store.requests, samples_reread()
    assert [ds[i] for i in (4, 6, 7)] == [rows[4], rows[6], rows[7]]  # the rest of its row group is kept
    assert samples_reread() - reread == 1 and ds.store.requests - before == 1 + 2  # its checksums, the row group twice
    with pytest.raises(SkipSample if on_corrupt == "skip" else ParquetReadError,
                       match=r"d.parquet row group 1 \(samples 4..7\): row 1 differs from its checksum \(written by "
                             r"`hetero index`\), read twice from the source"):
        ds[5]
    assert [ds[i] for i in range(12) if i != 5] == rows[:5] + rows[6:]


def test_a_flipped_label_is_caught_too(tmp_path):
    rows = [(b"img-%02d" % i * 8, 1) for i in range(8)]
    path = _plain(tmp_path / "d.parquet", rows)
    index_parquet(str(path))
    raw = bytearray(path.read_bytes())
    labels = bytes(pa.array([1] * 4, pa.int64()).buffers()[1])  # row group 1's label values, back to back
    at = raw.rindex(labels) + 8 * 2  # row 6's label
    raw[at] ^= 0x02  # 1 -> 3: a valid class index, wrong
    path.write_bytes(bytes(raw))
    ds = ParquetDataset(str(path), cache_dir=str(tmp_path / "c"))
    assert [ds[i] for i in (4, 5, 7)] == [rows[4], rows[5], rows[7]]
    with pytest.raises(ParquetReadError, match="row 2 differs from its checksum"):
        ds[6]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_flipped_byte_of_an_indexed_file_ever_reaches_training(tmp_path, data):
    work = Path(tempfile.mkdtemp(dir=tmp_path))  # one folder per example: tmp_path is shared by them
    rows = _rows(8, seed=3)
    clean = _plain(work / "clean" / "d.parquet", rows, **data.draw(st.sampled_from(
        [{}, {"compression": "snappy"}, {"use_dictionary": True, "compression": "zstd"}])))
    index_parquet(str(clean))
    meta = pq.read_metadata(clean)
    chunks = [meta.row_group(g).column(j) for g in range(meta.num_row_groups) for j in range(2)]
    spans = [(c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset,
              c.total_compressed_size) for c in chunks]  # the pages of each column chunk: headers and values
    size = clean.stat().st_size
    start, length = data.draw(st.sampled_from(spans + [(0, size)]))  # a column chunk's pages, or anywhere
    at, mask = data.draw(st.integers(start, start + length - 1)), data.draw(st.integers(1, 255))
    shutil.copytree(work / "clean", work / "bad")
    raw = bytearray((work / "bad" / "d.parquet").read_bytes())
    raw[at] ^= mask
    (work / "bad" / "d.parquet").write_bytes(bytes(raw))
    try:
        ds = ParquetDataset(str(work / "bad" / "d.parquet"), cache_dir=str(work / "c"), on_corrupt="skip",
                            unchecked="refuse")
    except ConfigError:
        return  # its footer no longer parses: named at start
    for i, row in enumerate(rows):
        try:
            got = ds[i]
        except SkipSample:
            continue  # named and counted, never trained
        assert got == row  # a row that reaches training is the row that was indexed


def test_without_checksums_a_notice_per_file_names_the_command(tmp_path, caplog):
    rows = _rows(8)
    _plain(tmp_path / "data" / "a.parquet", rows)
    _plain(tmp_path / "data" / "b.parquet", rows)
    _plain(tmp_path / "data" / "c.parquet", rows, write_page_checksum=True)  # checked by its page CRCs
    location = str(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger=LOG):
        ParquetDataset(location, cache_dir=str(tmp_path / "c"))
        ParquetDataset(location, cache_dir=str(tmp_path / "c"))  # the same process again: said once
    said = [r.getMessage() for r in caplog.records if r.name == LOG]
    assert len(said) == 2 and "a.parquet: its rows are read unchecked" in said[0] and "b.parquet" in said[1]
    assert all(f"`hetero index {location}`" in m and "no page CRCs" in m for m in said)
    assert hetero(["index", location, "--quiet"]) == 0
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOG):
        ds = ParquetDataset(location, cache_dir=str(tmp_path / "c"))
    assert not [r for r in caplog.records if r.name == LOG]  # all checked now: nothing to say
    assert list(ds.checks) == [ps.Check.ROW_SUMS] * 3 and [ds[i] for i in range(24)] == rows * 3


def test_unchecked_refuse_names_the_file_and_the_fix(tmp_path):
    rows = _rows(8)
    _plain(tmp_path / "data" / "a.parquet", rows)
    with pytest.raises(ConfigError, match=r"a.parquet: its rows would be read unchecked \(no page CRCs, and no row "
                                          r"checksums .*pipeline.unchecked='refuse'; write row checksums with "
                                          r"`hetero index .*/data`"):
        ParquetDataset(str(tmp_path / "data"), cache_dir=str(tmp_path / "c"), unchecked="refuse")
    index_parquet(str(tmp_path / "data"))
    ds = ParquetDataset(str(tmp_path / "data"), cache_dir=str(tmp_path / "c"), unchecked="refuse")
    assert [ds[i] for i in range(8)] == rows
    _plain(tmp_path / "data" / "a.parquet", _rows(8, seed=1))  # written again: its checksums are stale
    with pytest.raises(ConfigError, match="made for another version of the file"):
        ParquetDataset(str(tmp_path / "data"), cache_dir=str(tmp_path / "c"), unchecked="refuse")
    with pytest.raises(ConfigError, match=r"unchecked='never' must be 'warn' \(.*\) or 'refuse'"):
        ParquetDataset(str(tmp_path / "data"), unchecked="never")


def test_checksums_kept_apart_from_a_read_only_location_and_the_pipeline_options(tmp_path, capsys):
    rows = _rows(16)
    _plain(tmp_path / "ro" / "a.parquet", rows)
    dest = tmp_path / "sums"
    assert hetero(["index", str(tmp_path / "ro"), "--to", str(dest), "--quiet"]) == 0
    out = "".join(capsys.readouterr())
    assert "wrote row checksums of 16 rows in 1 Parquet file(s)" in out and f"pipeline.index={dest}" in out
    assert (dest / ps.FOLDER_NAME).exists() and not (tmp_path / "ro" / ps.FOLDER_NAME).exists()
    assert hetero(["index", str(tmp_path / "ro"), "--to", str(dest), "--quiet"]) == 2
    assert "already exists; pass --overwrite" in "".join(capsys.readouterr())
    base = {"parquet": str(tmp_path / "ro"), "batch_size": 4, "image_size": 32, "cache_dir": str(tmp_path / "c"),
            "unchecked": "refuse"}
    with pytest.raises(ConfigError, match="pipeline.unchecked='refuse'"):
        PipelineSpec("data_service.pipelines.images:build_pipeline", base).load()
    pipe = PipelineSpec("data_service.pipelines.images:build_pipeline", {**base, "index": str(dest)}).load()
    assert list(pipe.dataset.shards.checks) == [ps.Check.ROW_SUMS]


def test_a_damaged_checksum_file_is_refused_naming_it(tmp_path):
    _plain(tmp_path / "data" / "a.parquet", _rows(8))
    index_parquet(str(tmp_path / "data"))
    sums = tmp_path / "data" / ps.FOLDER_NAME
    raw = bytearray(sums.read_bytes())
    raw[20] ^= 0x01  # in its header
    sums.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match=f"{ps.FOLDER_NAME} is not a row-checksum file .* write it again"):
        ParquetDataset(str(tmp_path / "data"), cache_dir=str(tmp_path / "c"))


def test_the_page_crc_probe_reads_a_page_header():
    import io

    table = pa.table({"image": pa.array([b"x" * 100] * 10, pa.binary()), "label": pa.array(range(10), pa.int64())})
    for crc in (False, True):
        for kw in ({}, {"compression": "none", "use_dictionary": False}, {"compression": "zstd"}):
            buf = io.BytesIO()
            pq.write_table(table, buf, write_page_checksum=crc, row_group_size=5, **kw)
            raw, meta = buf.getvalue(), pq.read_metadata(io.BytesIO(buf.getvalue()))
            for j in range(2):
                c = meta.row_group(1).column(j)
                at = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else \
                    c.data_page_offset
                assert ps.has_page_crc(raw[at:at + ps.PAGE_HEAD]) is crc
    assert ps.has_page_crc(b"") is False and ps.has_page_crc(b"\x00") is False


def test_the_bar_counts_bytes_of_the_total_and_an_existing_sidecar_fails_before_it(tmp_path, capsys):
    _plain(tmp_path / "data" / "a.parquet", _rows(8))
    _plain(tmp_path / "data" / "b.parquet", _rows(8, seed=1))
    total = sum(p.stat().st_size for p in (tmp_path / "data").glob("*.parquet"))
    assert hetero(["index", str(tmp_path / "data")]) == 0
    err = capsys.readouterr().err.replace("\r", "\n")
    from tqdm import tqdm

    assert "checksumming Parquet rows: 100%" in err and f"/{tqdm.format_sizeof(total)}" in err, err
    assert hetero(["index", str(tmp_path / "data")]) == 2
    out = capsys.readouterr()
    assert "already exists; pass --overwrite" in out.err and len(out.err.splitlines()) == 1  # no bar before the one line
