"""What the decoded-image cache's CRC32C check costs: time per batch served from the cache, checked or not.

    python -m benchmarks.decoded_cache_cost [--work DIR] [--images 256] [--batch-size 32] [--rounds 4] [--json out.json]

Photo-like JPEGs (:mod:`benchmarks.photos`) in an image folder; the image pipeline with
``decoded_cache_bytes`` on (fused crop and decode, RandomResizedCrop(224) from images kept at
short side 258, flip) fills the cache in one epoch, then builds every batch of later epochs from
it twice: once as the product does (each hit's CRC32C checked in place) and once with the entry
trusted as it was before entries carried a checksum (its magic and length only, the same bytes
read). One core, one torch thread, batch by batch with the order swapped each time so drift in the
machine's speed falls on both alike; CPU seconds per batch (``time.process_time``) summed per
variant. The check alone (:func:`data_service.pipelines.decoded_cache.intact` over every entry)
is timed too, in microseconds per image and GB/s.
"""
from __future__ import annotations

import os
import tempfile
import time

from benchmarks.common import cli, report

PIPELINE = "data_service.pipelines.images:build_pipeline"


def _length_only():
    """A :class:`DecodedCache` that trusts an entry whose magic and length are right (no CRC32C)."""
    import torch

    from data_service.pipelines.decoded_cache import HEADER, MAGIC, DecodedCache

    class LengthOnly(DecodedCache):
        def get(self, key: str):
            buf = self.files.read(key)
            if buf is None or len(buf) < HEADER.size:
                return None
            magic, rows, cols, _ = HEADER.unpack_from(buf)
            if magic != MAGIC or len(buf) != HEADER.size + rows * cols * 3:
                return None
            return torch.frombuffer(buf, dtype=torch.uint8, offset=HEADER.size).view(rows, cols, 3)

    return LengthOnly


def _seconds(pipe, cfg, epoch: int, batch: int) -> float:
    from data_service.contract.pipeline import build_batch

    start = time.process_time()
    build_batch(pipe, cfg, 1, epoch, batch)
    return time.process_time() - start


def _check_us(root: str, passes: int = 5) -> tuple[float, float]:
    """Microseconds per entry of the CRC32C check alone, and its GB/s, over every entry under ``root``."""
    from data_service.pipelines.decoded_cache import intact

    bufs = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            if not n.startswith(".") and "." not in n:
                with open(os.path.join(dirpath, n), "rb") as f:
                    bufs.append(bytearray(f.read()))
    start = time.perf_counter()
    for _ in range(passes):
        assert all(intact(b) for b in bufs)
    seconds = (time.perf_counter() - start) / passes
    return seconds / len(bufs) * 1e6, sum(map(len, bufs)) / seconds / 1e9


def main(argv: list[str] | None = None) -> int:
    import torch

    from benchmarks.photos import write_photo_folder
    from data_service.contract.pipeline import PipelineSpec, build_batch
    from hetero.planning.profile import pinned

    p = cli.parser(__doc__, prog="python -m benchmarks.decoded_cache_cost")
    p.add_argument("--work", default="", help="folder kept between runs for the photos (default: a temporary one)")
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4, help="passes over every batch, per variant, alternating")
    cli.add_json(p)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-decoded-") as tmp, \
            tempfile.TemporaryDirectory(prefix="bench-decoded-", dir="/dev/shm") as shm:
        photos = os.path.join(args.work or tmp, "photos")
        write_photo_folder(photos, args.images)
        torch.set_num_threads(1)
        options = {"data_dir": photos, "batch_size": args.batch_size, "drop_last": True,
                   "decoded_cache_bytes": "4GB", "decoded_cache_dir": shm}
        pipes = {name: PipelineSpec(PIPELINE, options).load() for name in ("length only", "checked")}
        pipes["length only"].transform.crop_decode.cache.__class__ = _length_only()
        cfg = pipes["checked"].epoch_shape()
        seconds = {name: 0.0 for name in pipes}
        with pinned([sorted(os.sched_getaffinity(0))[0]]):
            for i in range(cfg.num_batches):  # epoch 0 fills the cache (both variants share its folder)
                build_batch(pipes["checked"], cfg, 1, 0, i)
            for name in pipes:  # warm-up: one epoch from the cache each
                for i in range(cfg.num_batches):
                    _seconds(pipes[name], cfg, 1, i)
            for r in range(args.rounds):
                for i in range(cfg.num_batches):  # batch by batch, the order swapped each time
                    order = ("length only", "checked") if (r + i) % 2 == 0 else ("checked", "length only")
                    for name in order:
                        seconds[name] += _seconds(pipes[name], cfg, 2 + r, i)
            check_us, check_gbs = _check_us(shm)
        hits = pipes["checked"].transform.counts["cache hit"]
        for pipe in pipes.values():
            pipe.close()
    batches = cfg.num_batches * args.rounds
    ms = {name: 1e3 * s / batches for name, s in seconds.items()}
    ratio = ms["checked"] / ms["length only"]
    print(f"{report.command('python -m benchmarks.decoded_cache_cost', argv)}  ({report.stamp()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")
    print(f"image pipeline from the decoded cache (crop, resize to 224, flip), one core, batches of {args.batch_size}, "
          f"{batches} batches per variant in {args.rounds} alternating rounds ({hits} hits checked):")
    print(f"  entry trusted (magic and length only): {ms['length only']:.2f} ms per batch")
    print(f"  entry's CRC32C checked on every hit:   {ms['checked']:.2f} ms per batch")
    print(f"  ratio {ratio:.4f} (cost {100 * (ratio - 1):+.2f} %)")
    print(f"  the check alone: {check_us:.1f} us per image ({check_gbs:.1f} GB/s, in place)")
    report.write_json(args.json, {"benchmark": "decoded_cache_cost", "date": report.stamp(),
                                  "command": report.command("python -m benchmarks.decoded_cache_cost", argv),
                                  "batches_per_variant": batches, "ms_per_batch": ms, "ratio": ratio,
                                  "check_us_per_image": check_us, "check_gb_per_s": check_gbs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
