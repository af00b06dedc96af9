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

from _epoch_audit import data_nodes, read_epoch_and_check
from conftest import TOKEN
from data_service.contract.tensor_layout import batch_digest
from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions
from dnn_worker import LocalDataset, RemoteDataset, ResumableLoader

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
    from data_service.prepare.writer import prepare
    from hetero.synthetic.images import write_image_folder

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
    options = {**data[source], "batch_size": 4, "shuffle_block": 4}  # 12 blocks: all on one node by chance, 1e-5
    before = fingerprint(data["sources"])
    ref = reference(options, epoch=1)
    with data_nodes(PIPELINE, options, nservers, cache_root=tmp_path, probe=False) as servers:
        built = read_epoch_and_check(servers, ref, tmp_path / "audit.jsonl", world)
    assert sum(1 for b in built if b > 0) >= min(nservers, 2), built  # affinity spreads blocks over servers
    assert fingerprint(data["sources"]) == before


@pytest.mark.parametrize("source", ["wds", pytest.param("parquet", marks=pytest.mark.slow)])
def test_a_stopped_epoch_resumes_exactly(data, tmp_path, monkeypatch, source):
    options = data[source]
    before = fingerprint(data["sources"])
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "node"))
    server = DataServer(PipelineSpec(PIPELINE, options), TOKEN, ServerOptions(num_workers=1, probe=False)).start()
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


def _epoch(options: dict) -> tuple[int, int]:
    """(samples served, samples skipped) of one in-process epoch."""
    ds = LocalDataset(PipelineSpec(PIPELINE, options), seed=0)
    served = sum(len(b["label"]) for b in ds)
    return served, ds.pipeline().samples_skipped


@pytest.mark.parametrize("on_corrupt", ["skip", "fail"])
def test_a_parquet_row_group_that_does_not_decode_is_skipped_and_counted_or_named(data, tmp_path, on_corrupt):
    import pyarrow.parquet as pq

    src = Path(data["parquet"]["parquet"]) / "train-00000.parquet"
    table = pq.read_table(src)
    bad = tmp_path / "hf" / "train.parquet"
    bad.parent.mkdir()
    pq.write_table(table, bad, row_group_size=4, use_dictionary=False)
    raw = bytearray(bad.read_bytes())
    at = pq.read_metadata(bad).row_group(1).column(0).data_page_offset + 3
    raw[at:at + 24] = b"\xff" * 24  # row group 1's image page header
    bad.write_bytes(bytes(raw))
    options = {**BASE, "parquet": str(bad), "on_corrupt": on_corrupt, "cache_dir": str(tmp_path / "cache")}
    if on_corrupt == "skip":
        assert _epoch(options) == (len(table) - 4, 4)  # rows 4..7: the second row group
    else:
        with pytest.raises(Exception, match=r"train.parquet row group 1 \(samples 4..7\).*on_corrupt=skip"):
            _epoch(options)


@pytest.mark.parametrize("on_corrupt", ["skip", "fail"])
def test_tar_images_of_every_accepted_type_decode_and_a_corrupt_one_is_skipped_or_named(tmp_path, on_corrupt):
    import io

    import numpy as np
    import webdataset as wds
    from PIL import Image

    from data_service.shards.wds_index import index_tars

    def image(fmt: str, k: int) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(np.random.default_rng(k).integers(0, 255, (40, 36, 3), dtype=np.uint8)).save(buf, fmt)
        return buf.getvalue()

    with wds.TarWriter(str(tmp_path / "a.tar")) as w:
        w.write({"__key__": "s000", "jpg": b"\xff\xd8 not a jpeg", "cls": "1"})  # first: its batch keeps others
        for k, (ext, fmt) in enumerate([("jpg", "JPEG"), ("jpeg", "JPEG"), ("png", "PNG"), ("webp", "WEBP")] * 4):
            w.write({"__key__": f"s{k + 1:03d}", ext: image(fmt, k), "cls": str(k % 2)})
    index_tars(str(tmp_path))
    options = {**BASE, "shards": str(tmp_path), "on_corrupt": on_corrupt, "shuffle_block": 8}
    if on_corrupt == "skip":
        assert _epoch(options) == (16, 1)
    else:
        with pytest.raises(Exception, match=r"sample 0 of .*does not decode.*on_corrupt=skip"):
            _epoch(options)


def test_count_classes_of_tars_indexed_elsewhere_and_of_parquet(data):
    from data_service.pipelines.sources import count_classes

    assert count_classes(shards=data["wds"]["shards"], index=data["wds"]["index"]) == 4
    assert count_classes(parquet=data["parquet"]["parquet"]) == 4
