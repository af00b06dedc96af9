"""Tars and Parquet files read in place from S3: moto's real server behind the counting proxy.

``hetero index`` over an S3 prefix LISTs it once and GETs each shard's bytes once, writes only the
index (elsewhere); the tars and a Parquet export are then read through the node cache, every
byte fetched once per node.
"""
from __future__ import annotations

import io
import tarfile

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from data_service.shards import ShardDataset  # noqa: E402
from data_service.shards.parquet import ParquetDataset  # noqa: E402
from data_service.shards.parquet_sums import PAGE_HEAD, Check, index_parquet  # noqa: E402
from data_service.shards.wds_index import index_tars  # noqa: E402
from data_service.storage import S3Store  # noqa: E402
from _s3_env import s3_with_bucket  # noqa: E402

BUCKET = "in-place-tests"


@pytest.fixture(scope="module")
def s3():
    with s3_with_bucket(BUCKET) as srv:
        yield srv


def _tar_bytes(shard: int) -> tuple[bytes, list[tuple[bytes, int]]]:
    buf, samples = io.BytesIO(), []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for i in range(30):
            data = bytes([shard, i]) * (200 + 53 * i)
            samples.append((data, i % 4))
            for name, body in ((f"k{shard}-{i:03d}.jpg", data), (f"k{shard}-{i:03d}.cls", b"%d" % (i % 4))):
                info = tarfile.TarInfo(name)
                info.size = len(body)
                t.addfile(info, io.BytesIO(body))
    return buf.getvalue(), samples


def test_tars_in_s3_indexed_with_each_byte_read_once_then_read_in_place(s3, tmp_path):
    store = S3Store(f"s3://{BUCKET}/laion")
    written, size = [], 0
    for k, name in enumerate(["a/000.tar", "a/001.tar", "b/000.tar"]):
        raw, samples = _tar_bytes(k)
        store.write_bytes(name, raw)
        written += samples
        size += len(raw)
    s3.proxy.reset_counters()
    summary = index_tars(f"s3://{BUCKET}/laion", f"s3://{BUCKET}/laion-index")
    c = s3.proxy.counters()
    shards = {p: n for p, n in c["path_bytes"].items() if p.endswith(".tar")}
    assert summary.samples == 90 and sum(shards.values()) == size == summary.bytes_read  # each byte once
    assert len(shards) == 3 and c["ranged_gets"] == 3  # one ranged read per (small) shard
    assert sorted(n for n, _ in store.list()) == ["a/000.tar", "a/001.tar", "b/000.tar"]  # nothing written there
    ds = ShardDataset(f"s3://{BUCKET}/laion", index=f"s3://{BUCKET}/laion-index", block_samples=16,
                      cache_dir=str(tmp_path))
    assert [ds[i] for i in range(len(ds))] == written
    s3.proxy.reset_counters()  # a pattern: one LIST of its folder, no request per shard beyond its read
    assert index_tars(f"s3://{BUCKET}/laion", str(tmp_path / "idx"), pattern="a/{000..001}.tar").samples == 60
    assert s3.proxy.counters()["ranged_gets"] == 2 and s3.proxy.counters()["requests"].get("HEAD", 0) == 0


def test_a_parquet_export_in_s3_each_row_group_fetched_once_per_node(s3, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [(bytes([i]) * (100 + i), i % 5) for i in range(50)]
    buf = io.BytesIO()
    pq.write_table(pa.table({"image": pa.array([{"bytes": b, "path": ""} for b, _ in rows]),
                             "label": pa.array([y for _, y in rows], pa.int64())}), buf, row_group_size=16)
    S3Store(f"s3://{BUCKET}/hf").write_bytes("train-00000.parquet", buf.getvalue())
    s3.proxy.reset_counters()
    ds = ParquetDataset(f"s3://{BUCKET}/hf", block_samples=16, cache_dir=str(tmp_path))
    assert [ds[i] for i in range(len(ds))] == rows and ds.classes == ["0", "1", "2", "3", "4"]
    read = s3.proxy.counters()["path_bytes"]
    # each byte once, and the first page header once more (does the file carry page CRCs?)
    assert sum(n for p, n in read.items() if p.endswith(".parquet")) <= len(buf.getvalue()) + PAGE_HEAD
    s3.proxy.reset_counters()
    again = ParquetDataset(f"s3://{BUCKET}/hf", block_samples=16, cache_dir=str(tmp_path))  # another worker
    assert [again[i] for i in range(len(again))] == rows
    assert s3.proxy.counters()["requests"].get("GET", 0) == 1  # its LIST; footers and row groups from the cache
    assert index_parquet(f"s3://{BUCKET}/hf").rows == 50  # row checksums for a file without page CRCs, beside it
    checked = ParquetDataset(f"s3://{BUCKET}/hf", block_samples=16, cache_dir=str(tmp_path), unchecked="refuse")
    assert [checked[i] for i in range(len(checked))] == rows and list(checked.checks) == [Check.ROW_SUMS]
