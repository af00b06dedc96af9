"""Data users already have, read in place by real data servers: WebDataset tars (indexed by
``hetero index``, the index kept apart) and a Parquet export.

One image folder is written three ways in the same order: ``hetero prepare``'s shards, tars from
the ``webdataset`` library's writer (its own keys, ``.json`` labels) and a Hugging Face-style
Parquet file. The image pipeline gives the same batches, bit for bit, from all three; each is
served exactly once by 3 data nodes with blocks spread by affinity, a stopped epoch resumes exactly
from one (every batch once, in order), and the sources are never written.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from conftest import TOKEN
from data_service.codec import batch_digest
from data_service.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions
from dnn_worker import LocalDataset, RemoteDataset, ResumableLoader
from hetero.testing import read_audit

PIPELINE = "data_service.pipelines.images:build_pipeline"
BASE = {"batch_size": 8, "image_size": 32, "shuffle_block": 16, "interleave": 2, "drop_last": False}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """``{"prepared": options, "wds": options, "parquet": options, "sources": [folders never written]}``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import webdataset as wds

    from data_service.pipelines.sources import scan
    from data_service.shards.wds_index import index_tars
    from hetero.prepare import prepare
    from hetero.synthetic_images import write_image_folder

    root = tmp_path_factory.mktemp("inplace")
    write_image_folder(root / "src", per_class=12, classes=4, seed=3, min_side=40, max_side=64)
    prepare(str(root / "src"), str(root / "prepared"), shard_size=1_000_000, workers=1, progress=False,
            shuffle_seed=None, verify=False)
    classes, samples = scan(root / "src")  # prepare's order without shuffling
    (root / "tars").mkdir()
    for k in range(4):
        with wds.TarWriter(str(root / "tars" / f"{k:06d}.tar")) as w:
            for j, (path, label) in enumerate(samples[12 * k:12 * k + 12]):
                w.write({"__key__": f"sample{12 * k + j:08d}", "jpg": Path(path).read_bytes(),
                         "json": {"label": classes[label], "source": path}})
    index_tars(str(root / "tars"), str(root / "tars-index"), label="json:label", classes=classes)
    (root / "hf").mkdir()
    table = pa.table({"image": pa.array([{"bytes": Path(p).read_bytes(), "path": p} for p, _ in samples]),
                      "label": pa.array([y for _, y in samples], pa.int64())})
    meta = {b"huggingface": json.dumps({"info": {"features": {"label": {"names": classes,
                                                                         "_type": "ClassLabel"}}}}).encode()}
    for k in range(2):
        pq.write_table(table.slice(24 * k, 24).replace_schema_metadata(meta), root / "hf" / f"train-{k:05d}.parquet",
                       row_group_size=16)
    return {"prepared": {**BASE, "shards": str(root / "prepared")},
            "wds": {**BASE, "shards": str(root / "tars"), "index": str(root / "tars-index")},
            "parquet": {**BASE, "parquet": str(root / "hf")},
            "sources": [root / "tars", root / "hf"]}


def reference(options: dict, seed: int = 5, epoch: int = 0) -> list[str]:
    ds = LocalDataset(PipelineSpec(PIPELINE, options), seed=seed)
    ds.set_epoch(epoch)
    return [batch_digest(b) for b in ds]


def fingerprint(folders) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() + str(p.stat().st_mtime_ns)
            for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


def test_tars_and_parquet_give_prepare_s_batches_bit_for_bit(data):
    ref = reference(data["prepared"], epoch=1)
    assert len(ref) == 6
    assert reference(data["wds"], epoch=1) == ref
    assert reference(data["parquet"], epoch=1) == ref


@pytest.mark.slow  # one data node serves each source exactly once, in order, in test_a_stopped_epoch_resumes_exactly
@pytest.mark.parametrize("source", ["wds", "parquet"])
@pytest.mark.parametrize("nservers, world", [(3, 2)])
def test_every_sample_once_from_3_data_nodes(data, tmp_path, monkeypatch, source, nservers, world):
    options = data[source]
    before = fingerprint(data["sources"])
    ref = reference(options, epoch=1)
    servers = []
    for i in range(nservers):  # each node its own cache, as separate machines have
        monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / f"node{i}"))
        servers.append(DataServer(PipelineSpec(PIPELINE, options), TOKEN, ServerOptions(num_workers=1)).start())
    try:
        audit = tmp_path / "audit.jsonl"
        for rank in range(world):
            ds = RemoteDataset([s.address for s in servers], TOKEN, seed=5, rank=rank, world_size=world,
                               audit_path=audit)
            ds.set_epoch(1)
            list(ds)
        rows = read_audit(audit)
        assert len(rows) == len(ref) // world * world and len({x["batch"] for x in rows}) == len(rows)
        assert all(x["sha256"] == ref[x["batch"]] for x in rows)
        if nservers > 1:
            built = [s.stats.snapshot().batches_built for s in servers]
            assert sum(1 for b in built if b > 0) >= 2, built  # affinity spreads blocks over servers
    finally:
        for s in servers:
            s.shutdown(grace_s=1)
    assert fingerprint(data["sources"]) == before


@pytest.mark.parametrize("source", ["wds", pytest.param("parquet", marks=pytest.mark.slow)])
def test_a_stopped_epoch_resumes_exactly(data, tmp_path, monkeypatch, source):
    options = data[source]
    before = fingerprint(data["sources"])
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "node"))
    server = DataServer(PipelineSpec(PIPELINE, options), TOKEN, ServerOptions(num_workers=1)).start()
    try:
        first = ResumableLoader(DataLoader(RemoteDataset([server.address], TOKEN, seed=1), batch_size=None))
        first.set_epoch(2)
        seen = []
        for batch in first:
            seen.append(batch_digest(batch))
            if len(seen) == 2:
                state = first.state_dict()  # stopped after 2 steps
                break
        resumed = ResumableLoader(DataLoader(RemoteDataset([server.address], TOKEN, seed=1), batch_size=None))
        resumed.load_state_dict(state)
        resumed.set_epoch(2)
        seen += [batch_digest(b) for b in resumed]
    finally:
        server.shutdown(grace_s=1)
    assert seen == reference(options, seed=1, epoch=2)
    assert fingerprint(data["sources"]) == before
