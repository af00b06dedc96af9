"""The decoded-image cache: a bounded host-wide store; the same batches whether it held an image or not."""
from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec, build_batch, seed_everything
from data_service.pipelines.crop_decode import CachedCropDecode
from data_service.pipelines.decoded_cache import HEADER, DecodedCache
from data_service.pipelines.images import decode_bytes
from data_service.server import DataServer, ServerOptions
from _odd_images import _photo

TARGET = "data_service.pipelines.images:build_pipeline"


def _jpeg(w: int, h: int, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(_photo(w, h, seed)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture()
def folder(tmp_path):
    root = tmp_path / "img"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(8):
            (root / f"c{c}" / f"{i}.jpg").write_bytes(_jpeg(180 + 10 * i, 140 + 5 * i, 10 * c + i))
    return root


def test_put_get_and_the_budget_across_instances(tmp_path):
    a = DecodedCache(str(tmp_path / "c"), budget=3 * (HEADER.size + 10 * 10 * 3))
    b = DecodedCache(str(tmp_path / "c"), budget=a.budget)  # another worker process of the same server
    images = [torch.randint(0, 255, (10, 10, 3), dtype=torch.uint8) for _ in range(4)]
    keys = [DecodedCache.key(bytes([i]) * 100) for i in range(4)]
    assert a.get(keys[0]) is None
    assert a.put(keys[0], images[0]) and b.put(keys[1], images[1]) and a.put(keys[2], images[2])
    assert not b.put(keys[3], images[3])  # the budget is spent: refused, counted nowhere
    for k, im in zip(keys[:3], images):
        assert torch.equal(b.get(k), im)
    assert b.get(keys[3]) is None
    assert a.stats() == {"decoded_cache_bytes": 3 * (HEADER.size + 300.0), "decoded_cache_images": 3.0,
                         "decoded_cache_budget_bytes": float(a.budget), "decoded_cache_damaged": 0.0}
    a.remove()
    assert not (tmp_path / "c").exists() and b.get(keys[0]) is None


def test_a_budget_larger_than_the_tmpfs_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not fit.*lower decoded_cache_bytes"):
        DecodedCache(str(tmp_path / "c"), budget=1 << 60)


def test_hit_and_miss_give_the_same_crop(tmp_path):
    cache = DecodedCache(str(tmp_path / "c"), budget=1 << 24)
    op = CachedCropDecode(64, 0.08, decode_bytes, cache, side=74)
    data = _jpeg(400, 300, 3)
    outs = []
    for _ in range(2):
        seed_everything(5)
        outs.append(op(((data, "x.jpg"), 0))[0])
    assert op.counts == {"cache miss": 1, "cache hit": 1}
    assert torch.equal(outs[0], outs[1]) and outs[0].shape == (3, 64, 64)
    stored = cache.get(cache.key(data))
    assert min(stored.shape[:2]) == 74 and stored.shape[2] == 3  # kept at the short side asked for
    # a changed file is a different entry, never the stale image
    assert cache.get(cache.key(_jpeg(400, 300, 4))) is None


def test_batches_do_not_depend_on_what_the_cache_held(folder, tmp_path):
    opts = {"data_dir": str(folder), "batch_size": 4, "image_size": 48, "decoded_cache_bytes": "16MB"}
    warm = PipelineSpec(TARGET, {**opts, "decoded_cache_dir": str(tmp_path / "a")}).load()
    cold = PipelineSpec(TARGET, {**opts, "decoded_cache_dir": str(tmp_path / "b")}).load()
    cfg = warm.epoch_shape()
    for index in range(cfg.num_batches):  # epoch 0 fills the warm cache
        build_batch(warm, cfg, 3, 0, index)
    assert warm.stats()["decoded_cache_images"] == 16
    for index in range(cfg.num_batches):  # epoch 1: every image a hit on one side, a miss on the other
        a, b = build_batch(warm, cfg, 3, 1, index), build_batch(cold, cfg, 3, 1, index)
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    assert warm.transform.counts["cache hit"] == 16
    warm.close()
    assert not list((tmp_path / "a").iterdir())


@pytest.mark.parametrize("bad, message", [
    ({"decoded_side": 20}, "decoded_side=20 is below image_size=48"),
    ({"decode": "whole"}, "decoded_cache_bytes needs decode='fused'"),
    ({"decoded_cache_bytes": "lots"}, "decoded_cache_bytes='lots'"),
])
def test_bad_cache_options_are_named(folder, tmp_path, bad, message):
    opts = {"data_dir": str(folder), "batch_size": 4, "image_size": 48, "decoded_cache_bytes": "1MB",
            "decoded_cache_dir": str(tmp_path), **bad}
    with pytest.raises(ConfigError, match=message):
        PipelineSpec(TARGET, opts).load()


def test_the_data_server_reports_the_cache_and_removes_it_at_shutdown(folder, tmp_path):
    from dnn_worker import RemoteDataset

    spec = PipelineSpec(TARGET, {"data_dir": str(folder), "batch_size": 4, "image_size": 32,
                                 "decoded_cache_bytes": "8MB", "decoded_cache_dir": str(tmp_path / "shm")})
    server = DataServer(spec, "tok", ServerOptions(num_workers=2)).start()
    try:
        ds = RemoteDataset([server.address], "tok", seed=0, connect_timeout=30.0)
        first = list(ds)
        ds.set_epoch(0)
        assert all(torch.equal(x["image"], y["image"]) for x, y in zip(first, list(ds)))  # hits == misses
        figures = dict(server.stats.snapshot().pipeline)
        assert figures["decoded_cache_images"] == 16 and figures["decoded_cache_budget_bytes"] == 8e6
        assert 0 < figures["decoded_cache_bytes"] <= 8e6
    finally:
        server.shutdown(grace_s=2.0)
    assert not list((tmp_path / "shm").iterdir())  # the pipeline's folder is gone with the server


def test_shrinking_keeps_the_whole_picture(tmp_path):
    # a DCT-scaled decode, then an antialiased resize: close to torchvision's whole decode, shrunk
    cache = DecodedCache(str(tmp_path / "c"), budget=1 << 24)
    data = _jpeg(1200, 900, 8)
    got = CachedCropDecode(224, 0.08, decode_bytes, cache, side=258).shrunk(data, "x").permute(2, 0, 1).float()
    ref = torch.nn.functional.interpolate(decode_bytes(data, "x").unsqueeze(0).float(), size=tuple(got.shape[1:]),
                                          mode="bilinear", antialias=True)[0]
    assert got.shape[1:] == (258, 344)
    assert float((got - ref).abs().mean()) < 3.0
    assert np.isfinite(float(got.mean()))


def test_without_the_compiled_part_cached_batches_are_the_stacked_crops(folder, tmp_path, monkeypatch):
    from data_service.pipelines import crop_decode

    monkeypatch.setattr(crop_decode, "_jpegcrop", None)  # a host where setup.py built no C extension
    opts = {"data_dir": str(folder), "batch_size": 4, "image_size": 48, "decoded_cache_bytes": "16MB"}
    warm = PipelineSpec(TARGET, {**opts, "decoded_cache_dir": str(tmp_path / "a")}).load()
    cold = PipelineSpec(TARGET, {**opts, "decoded_cache_dir": str(tmp_path / "b")}).load()
    plain = PipelineSpec(TARGET, {**opts, "decoded_cache_dir": str(tmp_path / "c")}).load()
    plain.transform.crop_decode.deferred = False  # each crop a finished tensor, torch.stack'ed
    cfg = warm.epoch_shape()
    for epoch in range(2):  # epoch 0 fills the warm cache, epoch 1 crops from it
        for index in range(cfg.num_batches):
            a = build_batch(warm, cfg, 3, epoch, index)
            if epoch == 1:
                b, c = build_batch(cold, cfg, 3, epoch, index), build_batch(plain, cfg, 3, epoch, index)
                assert torch.equal(a["image"], b["image"]) and torch.equal(a["image"], c["image"])
                assert torch.equal(a["label"], c["label"]) and a["image"].shape == (4, 3, 48, 48)
    assert warm.transform.counts == {"cache miss": 16, "cache hit": 16}


@pytest.mark.parametrize("leave", ["shutdown", "drain"])
@pytest.mark.slow
def test_a_server_leaving_keeps_the_cache_of_the_servers_that_stay(folder, tmp_path, leave):
    from dnn_worker import RemoteDataset
    from dnn_worker.transport.control import ControlClient

    opts = {"data_dir": str(folder), "batch_size": 4, "image_size": 32, "decoded_cache_bytes": "8MB"}
    spec = PipelineSpec(TARGET, {**opts, "decoded_cache_dir": str(tmp_path / "shm")})
    reference = PipelineSpec(TARGET, {**opts, "decoded_cache_dir": str(tmp_path / "ref")}).load()
    cfg = reference.epoch_shape()
    leaving = DataServer(spec, "tok", ServerOptions(num_workers=1)).start()
    staying = DataServer(spec, "tok", ServerOptions(num_workers=1)).start()
    try:
        ds = RemoteDataset([staying.address], "tok", seed=0, connect_timeout=30.0, window=1)
        got = []
        for epoch in range(3):
            ds.set_epoch(epoch)
            for index, batch in enumerate(ds):
                got.append((epoch, index, batch))
                if (epoch, index) == (0, 1):  # mid-way through the first epoch, while images are being cached
                    if leave == "drain":
                        with ControlClient(leaving.address, "tok", "test") as ctl:
                            ctl.shutdown(grace_s=2.0, reason="drain")
                        assert leaving.wait(30.0)
                    else:
                        leaving.shutdown(grace_s=2.0)
        assert [(e, i) for e, i, _ in got] == [(e, i) for e in range(3) for i in range(cfg.num_batches)]
        for epoch, index, batch in got:
            want = build_batch(reference, cfg, 0, epoch, index)
            assert torch.equal(batch["image"], want["image"]) and torch.equal(batch["label"], want["label"])
        assert dict(staying.stats.snapshot().pipeline)["decoded_cache_images"] == 16
    finally:
        leaving.shutdown(grace_s=2.0)
        staying.shutdown(grace_s=2.0)
    assert not list((tmp_path / "shm").iterdir())  # the last server to leave removes the folder


def _entries(folder) -> list:
    """The cache's entry files (not its locks, counters or files being written)."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and "." not in p.name)


def _zero(path, at: int, length: int = 4096) -> None:
    raw = bytearray(path.read_bytes())
    raw[at:at + length] = bytes(min(length, len(raw) - at))
    path.write_bytes(bytes(raw))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 10 ** 9), mask=st.integers(1, 255), cut=st.booleans())
def test_an_entry_with_any_byte_changed_or_cut_is_never_returned(tmp_path, at, mask, cut):
    root = tempfile.mkdtemp(dir=tmp_path)  # one folder per example: tmp_path is shared by them
    cache = DecodedCache(root, budget=1 << 20)
    image = torch.randint(0, 255, (7, 9, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(at % 97))
    key = cache.key(b"%d" % at)
    assert cache.put(key, image) and torch.equal(cache.get(key), image)
    path = Path(root) / key
    raw = bytearray(path.read_bytes())
    at %= len(raw)
    if cut:
        del raw[at:]
    else:
        raw[at] ^= mask
    path.write_bytes(bytes(raw))
    assert cache.get(key) is None  # a miss: the caller decodes the image again from its source
    assert not path.exists() and cache.stats()["decoded_cache_damaged"] == 1  # dropped, counted
    assert cache.put(key, image) and torch.equal(cache.get(key), image)  # the fresh decode is kept again
    cache.remove()


def test_an_entry_damaged_between_epochs_trains_the_clean_crop_and_is_counted(folder, tmp_path):
    from data_service.contract.pipeline import samples_reread

    opts = {"data_dir": str(folder), "batch_size": 4, "image_size": 48, "decoded_cache_bytes": "16MB"}
    warm = PipelineSpec(TARGET, {**opts, "decoded_cache_dir": str(tmp_path / "a")}).load()
    cold = PipelineSpec(TARGET, {**opts, "decoded_cache_dir": str(tmp_path / "b")}).load()
    cfg = warm.epoch_shape()
    for index in range(cfg.num_batches):  # epoch 0 fills the warm cache
        build_batch(warm, cfg, 3, 0, index)
    folder_a = next((tmp_path / "a").iterdir())
    entries = _entries(folder_a)
    assert len(entries) == 16
    _zero(entries[5], 3000)  # 4 KiB of one decoded image zeroed, as by a bad page of host memory
    before = samples_reread()
    for index in range(cfg.num_batches):
        a, b = build_batch(warm, cfg, 3, 1, index), build_batch(cold, cfg, 3, 1, index)
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    assert warm.transform.counts == {"cache miss": 17, "cache hit": 15}  # decoded again from its source
    assert samples_reread() - before == 1 and warm.stats()["decoded_cache_damaged"] == 1
    assert len(_entries(folder_a)) == 16  # the fresh decode is stored again
    warm.close()
    cold.close()


def test_the_data_server_counts_a_damaged_entry_in_its_stats(folder, tmp_path):
    from dnn_worker import RemoteDataset

    spec = PipelineSpec(TARGET, {"data_dir": str(folder), "batch_size": 4, "image_size": 32,
                                 "decoded_cache_bytes": "8MB", "decoded_cache_dir": str(tmp_path / "shm")})
    server = DataServer(spec, "tok", ServerOptions(num_workers=1)).start()
    try:
        ds = RemoteDataset([server.address], "tok", seed=0, connect_timeout=30.0)
        first = list(ds)
        for entry in _entries(next((tmp_path / "shm").iterdir()))[:2]:
            _zero(entry, 100)
        ds.set_epoch(0)
        assert all(torch.equal(x["image"], y["image"]) for x, y in zip(first, list(ds)))
        figures = dict(server.stats.snapshot().pipeline)
        assert figures["decoded_cache_damaged"] == 2 and figures["samples_reread"] == 2
        assert figures["decoded_cache_images"] == 16
    finally:
        server.shutdown(grace_s=2.0)
