"""What the per-sample CRC32C check costs the JPEG pipeline: images/s of one core with and without it.

    python -m benchmarks.checksum_cost [--work DIR] [--images 1024] [--batch-size 32] [--rounds 6] [--json out.json]

Photo-like JPEGs (:mod:`benchmarks.photos`) are written once with ``hetero prepare`` into local
shards; a second folder links the same shards beside an index without checksums (``index.bin``
version 2, as an earlier release wrote it). The image pipeline's ``build_batch`` (read the sample,
check it, decode, RandomResizedCrop(224), flip) runs on one core with one torch thread over every
batch of both, batch by batch with the order swapped each time so drift in the machine's speed
falls on both alike; the CPU seconds per batch (``time.process_time``) are summed per variant, and
the ratio of images/s (checked / unchecked) is the cost. A sample's read alone (``ShardDataset[i]``,
with and without the check) is timed too: the check's own cost, without the decode's noise.
"""
from __future__ import annotations

import os
import tempfile
import time

from benchmarks.common import cli, report

PIPELINE = "data_service.pipelines.images:build_pipeline"


def _unchecked_copy(shards: str, dest: str) -> None:
    """``dest``: the shards of ``shards`` (hard links) under an index.bin without checksums."""
    from data_service.shards.format import INDEX_NAME
    from data_service.shards.indexfile import IndexWriter, read_index

    os.makedirs(dest, exist_ok=True)
    index = read_index(shards)
    for k in range(len(index.shards)):
        name = index.shards.name(k)
        if not os.path.exists(os.path.join(dest, name)):
            os.link(os.path.join(shards, name), os.path.join(dest, name))
    with IndexWriter(dest) as w:
        for k in range(len(index.shards)):
            a, b = int(index.shards.first[k]), int(index.shards.first[k + 1])
            w.add_shard(index.shards.name(k), int(index.shards.sizes[k]), index.offsets[a:b], index.lengths[a:b],
                        index.labels[a:b])
        w.write_file(os.path.join(dest, INDEX_NAME), index.classes)


def _seconds(pipe, cfg, batch: int) -> float:
    """CPU seconds of building batch ``batch`` of epoch 0."""
    from data_service.contract.pipeline import build_batch

    start = time.process_time()
    build_batch(pipe, cfg, 1, 0, batch)
    return time.process_time() - start


def _read_us(folder: str, passes: int = 5) -> float:
    """CPU microseconds per sample of ``ShardDataset[i]`` alone (read, and check where the index has checksums)."""
    from data_service.shards import ShardDataset

    ds = ShardDataset(folder)
    for i in range(len(ds)):
        ds[i]
    start = time.process_time()
    for _ in range(passes):
        for i in range(len(ds)):
            ds[i]
    return (time.process_time() - start) / (passes * len(ds)) * 1e6


def main(argv: list[str] | None = None) -> int:
    import torch

    from benchmarks.photos import write_photo_folder
    from data_service.contract.pipeline import PipelineSpec
    from data_service.prepare.writer import prepare
    from hetero.planning.profile import pinned

    p = cli.parser(__doc__, prog="python -m benchmarks.checksum_cost")
    p.add_argument("--work", default="", help="folder kept between runs (default: a temporary one)")
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6, help="passes over every batch, per variant, alternating")
    cli.add_json(p)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-checksum-") as tmp:
        work = args.work or tmp
        photos, checked, unchecked = (os.path.join(work, d) for d in ("photos", "checked", "unchecked"))
        write_photo_folder(photos, args.images)
        if not os.path.exists(os.path.join(checked, "index.bin")):
            prepare(photos, checked, shard_size=64 << 20, workers=1, progress=False)
        _unchecked_copy(checked, unchecked)
        torch.set_num_threads(1)
        pipes = {}
        for name, folder in (("unchecked", unchecked), ("checked", checked)):
            pipe = PipelineSpec(PIPELINE, {"shards": folder, "batch_size": args.batch_size, "drop_last": True}).load()
            pipes[name] = (pipe, pipe.epoch_shape())
        batches = pipes["checked"][1].num_batches
        seconds = {name: 0.0 for name in pipes}
        with pinned([sorted(os.sched_getaffinity(0))[0]]):
            for name, (pipe, cfg) in pipes.items():  # warm-up: page cache, decoder, first use of each shard
                for i in range(batches):
                    _seconds(pipe, cfg, i)
            for r in range(args.rounds):
                for i in range(batches):  # batch by batch, the order swapped each time: drift hits both alike
                    for name in (("unchecked", "checked") if (r + i) % 2 == 0 else ("checked", "unchecked")):
                        seconds[name] += _seconds(*pipes[name], i)
            read_us = {name: _read_us(folder) for name, folder in (("unchecked", unchecked), ("checked", checked))}
    images = batches * args.batch_size * args.rounds
    rate = {name: images / s for name, s in seconds.items()}
    ratio = rate["checked"] / rate["unchecked"]
    print(f"{report.command('python -m benchmarks.checksum_cost', argv)}  ({report.stamp()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")
    print(f"JPEG shard pipeline (read, decode, RandomResizedCrop(224), flip), one core, {images} images per variant "
          f"in {args.rounds} alternating rounds:")
    print(f"  without the checksum check: {rate['unchecked']:.1f} images/s per core")
    print(f"  with the CRC32C check:      {rate['checked']:.1f} images/s per core")
    print(f"  ratio {ratio:.4f} (cost {100 * (1 - ratio):+.2f} %)")
    extra = read_us["checked"] - read_us["unchecked"]
    print(f"  a sample's read alone: {read_us['unchecked']:.1f} us unchecked, {read_us['checked']:.1f} us checked: "
          f"{extra:+.1f} us, {100 * extra * rate['unchecked'] / 1e6:+.2f} % of a core at the unchecked rate")
    report.write_json(args.json, {"benchmark": "checksum_cost", "date": report.stamp(),
                                  "command": report.command("python -m benchmarks.checksum_cost", argv),
                                  "images_per_variant": images, "images_per_s": rate, "ratio": ratio,
                                  "read_us_per_sample": read_us})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
