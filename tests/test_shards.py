"""Shards: hetero prepare's output, the shard dataset, block-shuffled plans, the block cache, affinity."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec, build_batch
from data_service.pipelines.images import CorruptImageError, decode, decode_bytes
from data_service.contract.sampler import EpochShape, batch_block, batch_indices
from data_service.shards import ShardDataset
from data_service.shards.cache import BlockCache
from data_service.shards.checksum import CorruptSampleError
from data_service.shards.format import INDEX_NAME
from data_service.storage import parse_size
from dnn_worker.fetch.affinity import rendezvous_owner
from data_service.prepare.writer import prepare
from _odd_images import write_odd_folder

PIPELINE = "data_service.pipelines.images:build_pipeline"


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> tuple[Path, dict[str, Path], Path, object]:
    root = tmp_path_factory.mktemp("odd")
    files = write_odd_folder(root / "src")
    summary = prepare(str(root / "src"), str(root / "shards"), shard_size=1 << 20, max_side=1000, workers=1,
                      progress=False)
    return root / "src", files, root / "shards", summary


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    """A drawn-shape folder (4 classes x 40) as shards of about 1 MB."""
    from hetero.synthetic.images import write_image_folder

    root = tmp_path_factory.mktemp("shapes")
    write_image_folder(root / "src", per_class=40, classes=4, seed=0)
    prepare(str(root / "src"), str(root / "shards"), shard_size=1 << 20, workers=1, progress=False)
    return root / "shards"


def _source_of(ds: ShardDataset, files: dict[str, Path], src: Path) -> dict[str, int]:
    """kind -> sample index, matched by bytes (prepare shuffles the order)."""
    by_bytes = {ds[i][0]: i for i in range(len(ds))}
    return {kind: by_bytes[p.read_bytes()] for kind, p in files.items() if p.read_bytes() in by_bytes}


def test_odd_files_are_carried_over_exactly_or_skipped_and_listed(odd):
    src, files, shards, summary = odd
    ds = ShardDataset(str(shards), block_samples=4)
    skipped = {Path(name).name: why for name, why in summary.skipped}
    assert set(skipped) == {"corrupt.jpg", "empty.jpg"}, summary.skipped
    assert "does not decode" in skipped["corrupt.jpg"] and "empty" in skipped["empty.jpg"]
    assert summary.samples == len(ds) == 6 + 8 and summary.reencoded == 1
    where = _source_of(ds, files, src)
    for kind in ("cmyk", "gray", "png_named_jpeg", "progressive", "rgba", "palette", "tiny"):
        data, label = ds[where[kind]]
        assert torch.equal(decode_bytes(data, kind), decode(str(files[kind]))), kind
        assert ds.classes[label] == "odd"
    assert "huge" not in where  # re-encoded: long side 2400 -> 1000
    huge = [decode_bytes(ds[i][0], "x") for i in range(len(ds)) if max(decode_bytes(ds[i][0], "x").shape[1:]) == 1000]
    assert len(huge) == 1 and tuple(huge[0].shape[1:]) == (667, 1000)
    assert any("corrupt.jpg" in line for line in summary.lines(str(shards)))


def test_shards_are_webdataset_tar_files(odd):
    wds = pytest.importorskip("webdataset")
    _, _, shards, _ = odd
    ds = ShardDataset(str(shards), block_samples=4)
    urls = sorted(str(p) for p in shards.glob("*.tar"))
    seen = []
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        body = sample.get("jpg", sample.get("png"))
        seen.append((bytes(body), int(sample["cls"])))
    assert seen == [(ds[i][0], ds[i][1]) for i in range(len(ds))]


def test_prepare_never_overwrites_silently(odd, tmp_path):
    src, _, _, _ = odd
    dest = tmp_path / "out"
    prepare(str(src), str(dest), shard_size=1 << 20, workers=1, progress=False)
    with pytest.raises(ConfigError, match="already holds shards.*--overwrite"):
        prepare(str(src), str(dest), shard_size=1 << 20, workers=1, progress=False)
    again = prepare(str(src), str(dest), shard_size=1 << 20, workers=1, progress=False, overwrite=True,
                    shuffle_seed=None)
    assert again.samples == 14 and len(ShardDataset(str(dest))) == 14


def test_hetero_prepare_cli(odd, tmp_path):
    from hetero.cli import main

    src, _, _, _ = odd
    assert main(["prepare", str(src), str(tmp_path / "cli"), "--shard-size", "1MB", "--workers", "1", "--quiet"]) == 0
    assert (tmp_path / "cli" / INDEX_NAME).exists()
    assert main(["prepare", str(src), str(tmp_path / "cli"), "--shard-size", "1MB", "--quiet"]) == 2
    assert main(["prepare", str(src), str(tmp_path / "x"), "--shard-size", "lots", "--quiet"]) == 2


@pytest.mark.parametrize("value, expected", [("256MB", 256_000_000), ("1GiB", 1 << 30), ("64k", 64_000),
                                             (4096, 4096), ("1.5GB", 1_500_000_000)])
def test_sizes_parse(value, expected):
    assert parse_size(value, "x") == expected


@pytest.mark.parametrize("value", ["", "12 parsecs", "-3MB", True])
def test_bad_sizes_are_named(value):
    with pytest.raises(ConfigError, match="x="):
        parse_size(value, "x")


def test_bad_shard_folders_fail_at_start_naming_the_fix(shapes, tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        ShardDataset(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="hetero prepare"):
        ShardDataset(str(tmp_path / "empty"))
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in shapes.iterdir():
        (broken / p.name).write_bytes(p.read_bytes())
    (broken / "shard-000001.tar").unlink()
    with pytest.raises(ConfigError, match="shard-000001.tar.*missing|missing.*shard-000001.tar"):
        ShardDataset(str(broken))
    (broken / INDEX_NAME).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ConfigError, match="not a hetero-shards index"):
        ShardDataset(str(broken))


# -- block-shuffled plans
@pytest.mark.parametrize("n, batch, block, interleave, drop_last",
                         [(1000, 8, 64, 4, False), (1000, 8, 64, 4, True), (96, 8, 32, 8, False), (50, 5, 50, 1, False)])
def test_block_plan_covers_every_sample_once_each_batch_from_one_block(n, batch, block, interleave, drop_last):
    cfg = EpochShape(n, batch, drop_last, True, block, interleave)
    seen, size = [], block or n
    for i in range(cfg.num_batches):
        idx = batch_indices(cfg, 7, 2, i)
        b = batch_block(cfg, 7, 2, i)
        assert set(idx) <= set(range(b * size, min((b + 1) * size, n))), (i, b)  # the samples of block b
        assert len(idx) == batch or (i == cfg.num_batches - 1 and not drop_last)
        seen += idx
    expected = n if not drop_last else n - n % batch
    assert len(seen) == len(set(seen)) == expected


def test_block_plan_is_a_pure_function_of_seed_and_epoch_and_interleaves_blocks():
    cfg = EpochShape(4096, 16, False, True, 256, 4)
    first = [batch_indices(cfg, 1, 0, i) for i in range(cfg.num_batches)]
    assert first == [batch_indices(EpochShape(4096, 16, False, True, 256, 4), 1, 0, i) for i in range(cfg.num_batches)]
    assert first != [batch_indices(cfg, 1, 1, i) for i in range(cfg.num_batches)]
    blocks = [batch_block(cfg, 1, 0, i) for i in range(8)]
    assert len(set(blocks[:4])) == 4 and blocks[:4] == blocks[4:8]  # 4 blocks alternate


def test_block_plan_rejects_blocks_that_split_batches():
    with pytest.raises(ConfigError, match="block_samples=.*multiple of batch_size"):
        EpochShape(100, 8, block_samples=12)


def test_pipeline_rounds_the_shuffle_block_to_whole_batches(shapes):
    pipe = PipelineSpec(PIPELINE, {"shards": str(shapes), "batch_size": 8, "shuffle_block": 20,
                                   "image_size": 32}).load()
    cfg = pipe.epoch_shape()
    assert cfg.block_samples == 24 and pipe.dataset.shards.block_samples == 24
    batch = build_batch(pipe, cfg, 1, 0, 0)
    assert batch["image"].shape == (8, 3, 32, 32)


# -- the block cache
def _fill_counting(directory: str, counter: str, name: str, size: int) -> None:
    cache = BlockCache(directory, 1 << 20)

    def fill(fd):
        with open(counter, "a") as f:
            f.write("x")
        time.sleep(0.5)  # the other processes arrive while this one fetches
        os.pwrite(fd, bytes([7]) * size, 0)

    fd = cache.open(name, size, fill)
    assert os.pread(fd, size, 0) == bytes([7]) * size
    os.close(fd)


def test_block_cache_fetches_once_per_node_across_processes(tmp_path):
    counter = tmp_path / "fills"
    ctx = mp.get_context("fork")  # the children run only os calls and BlockCache
    procs = [ctx.Process(target=_fill_counting, args=(str(tmp_path / "c"), str(counter), "b1", 200_000))
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert counter.read_text() == "x"


def test_block_cache_stays_within_its_bound_least_recently_used_first(tmp_path):
    cache = BlockCache(str(tmp_path), max_bytes=3000)
    fill = lambda n: (lambda fd: os.pwrite(fd, b"a" * n, 0))  # noqa: E731
    for name in ("a", "b", "c"):
        os.close(cache.open(name, 1000, fill(1000)))
        os.utime(cache.files.path(name), (1e9 + ord(name), 1e9 + ord(name)))
    os.close(cache.open("a", 1000, fill(1000)))  # used again: now the newest
    os.close(cache.open("d", 1000, fill(1000)))
    assert sorted(n for n in os.listdir(tmp_path) if not n.endswith(".lock")) == ["a", "c", "d"]
    with pytest.raises(ConfigError, match="does not fit cache_bytes"):
        cache.open("e", 5000, fill(5000))


# -- affinity
def test_rendezvous_moves_only_the_blocks_of_a_server_that_leaves():
    servers = [f"10.0.0.{i}:6000" for i in range(5)]
    before = {b: rendezvous_owner(b, servers, "fp") for b in range(2000)}
    counts = np.bincount([servers.index(o) for o in before.values()], minlength=5)
    assert counts.min() > 300  # spread over all five
    after = {b: rendezvous_owner(b, servers[:2] + servers[3:], "fp") for b in range(2000)}
    moved = [b for b in before if before[b] != after[b]]
    assert moved and all(before[b] == servers[2] for b in moved)
    assert {b: rendezvous_owner(b, list(reversed(servers)), "fp") for b in range(2000)} == before


def test_corrupt_bytes_in_a_shard_name_the_sample(shapes, tmp_path):
    pipe_dir = tmp_path / "bad"
    pipe_dir.mkdir()
    for p in shapes.iterdir():
        (pipe_dir / p.name).write_bytes(p.read_bytes())
    ds = ShardDataset(str(pipe_dir), block_samples=8)
    start = int(ds.index.offsets[3])
    tar = pipe_dir / ds.index.shards.name(ds.index.shard_at(3))
    data = bytearray(tar.read_bytes())
    data[start:start + int(ds.index.lengths[3])] = b"\0" * int(ds.index.lengths[3])
    tar.write_bytes(bytes(data))
    pipe = PipelineSpec(PIPELINE, {"shards": str(pipe_dir), "batch_size": 8, "image_size": 32}).load()
    with pytest.raises(CorruptSampleError, match=r"sample 3 of shard .*bad/shard-\d+\.tar \(bytes \d+\.\.\d+\) has "
                                                  r"CRC32C [0-9a-f]{8}, the index says .*on_corrupt=skip"):
        pipe.transform(pipe.dataset[3])  # the bytes fail their checksum when read: never decoded


def test_prepare_takes_a_map_style_data_set_by_import_path_in_source_order(tmp_path):
    summary = prepare("tests._prepare_source:make", str(tmp_path / "out"), shard_size=1_000_000, workers=1,
                      progress=False, shuffle_seed=None, options={"n": 6})
    ds = ShardDataset(str(tmp_path / "out"), block_samples=2)
    assert summary.samples == 6 and ds.classes == ["even", "odd"]
    for i in range(6):
        data, label = ds[i]
        image = decode_bytes(data, str(i))
        assert label == i % 2 and tuple(image.shape) == (3, 8 + i, 10)
        if not i % 2:  # tensors travel as PNG: exact
            assert torch.equal(image, torch.full((3, 8 + i, 10), 20 * i, dtype=torch.uint8))


def test_block_cache_removes_what_a_dead_process_left_half_written(tmp_path):
    cache = BlockCache(str(tmp_path), max_bytes=10_000)
    dead = mp.get_context("fork").Process(target=lambda: None)
    dead.start()
    dead.join()
    stale, live = tmp_path / f"b1.blk.{dead.pid}.part", tmp_path / f"b2.blk.{os.getpid()}.part"
    stale.write_bytes(b"x" * 100)
    live.write_bytes(b"x" * 100)
    os.close(cache.open("b3.blk", 100, lambda fd: os.pwrite(fd, b"y" * 100, 0)))
    assert not stale.exists() and live.exists()
