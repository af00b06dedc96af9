"""The JPEG image-folder pipeline's own figures: images/s per data-worker core, bytes per image.

    python -m benchmarks.images [--images DIR] [--batch-size 32] [--batches 8] [--json out.json]

* images/s per core: ``hetero.planning.profile`` builds batches of ``data_service.pipelines.images`` (decode
  with torchvision's JPEG decoder, RandomResizedCrop(224), flip) on one core, one torch thread,
  as a data worker does; median over ``--batches`` after one warm-up batch.
* bytes per image on the wire: one real data server (loopback TCP, no shared memory) serves
  the same batches with ``finish_on="device"`` (uint8 crops, normalised on the training device)
  and ``finish_on="server"`` (float32, normalised on the server); its ``bytes_sent`` counter
  (payload plus per-batch header) divided by the images sent.

Without ``--images``, a folder of drawn shapes (300-500 px JPEGs) is written to a temp folder.
"""
from __future__ import annotations

import itertools
import os
import secrets
import tempfile

from benchmarks.common import cli, report

PIPELINE = "data_service.pipelines.images:build_pipeline"


def served_bytes_per_image(images: str, batch_size: int, batches: int, finish_on: str) -> float:
    """``bytes_sent`` of a real data server per image, over ``batches`` batches."""
    from data_service.contract.pipeline import PipelineSpec
    from data_service.server import DataServer, ServerOptions
    from dnn_worker import RemoteDataset

    token = secrets.token_hex(16)
    spec = PipelineSpec(PIPELINE, {"data_dir": images, "batch_size": batch_size, "finish_on": finish_on})
    server = DataServer(spec, token, ServerOptions(num_workers=1, host="127.0.0.1")).start()
    try:
        ds = RemoteDataset([server.address], token, shared_memory=False, connect_timeout=60.0)
        sent = sum(len(b["label"]) for b in itertools.islice(iter(ds), batches))
        return server.stats.snapshot().bytes_sent / sent
    finally:
        server.shutdown(grace_s=5.0, reason="benchmark done")


def cpu_seconds_per_batch(images: str, batch_size: int, batches: int) -> float:
    """Median CPU seconds (``time.process_time``) one core spends per batch: unlike wall time, not
    stretched when other processes share the core."""
    import statistics
    import time

    from data_service.contract.pipeline import PipelineSpec, build_batch

    from hetero.planning.profile import pinned

    pipe = PipelineSpec(PIPELINE, {"data_dir": images, "batch_size": batch_size}).load()
    cfg = pipe.epoch_shape()
    times = []
    with pinned([sorted(os.sched_getaffinity(0))[0]]):
        for i in range(batches + 1):
            start = time.process_time()
            build_batch(pipe, cfg, 1, 0, i % cfg.num_batches)
            times.append(time.process_time() - start)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> int:
    from hetero.synthetic.images import write_image_folder

    from hetero.planning.profile import profile_pipeline

    p = cli.parser(__doc__, prog="python -m benchmarks.images")
    p.add_argument("--images", default=None, help="image folder root/<class>/*.jpg (default: drawn shapes)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        images = args.images
        if images is None:
            images = tmp
            write_image_folder(tmp, per_class=-(-(args.batches + 1) * args.batch_size // 4), classes=4,
                               threads=len(os.sched_getaffinity(0)))
        prof = profile_pipeline(PIPELINE, {"data_dir": images, "batch_size": args.batch_size},
                                batches=args.batches, warmup=1)
        per_core = args.batch_size / prof.median_s
        cpu_s = cpu_seconds_per_batch(images, args.batch_size, args.batches)
        wire = {f: served_bytes_per_image(images, args.batch_size, min(args.batches, 4), f)
                for f in ("device", "server")}
    print(f"JPEG image-folder pipeline (decode + RandomResizedCrop(224) + flip), batch {args.batch_size}:")
    print(f"  one data-worker core: {prof.median_s * 1000:.1f} ms/batch median ({prof.min_s * 1000:.1f}-"
          f"{prof.max_s * 1000:.1f}) wall, {per_core:.0f} images/s per core; CPU time {cpu_s * 1000:.1f} ms/batch, "
          f"{args.batch_size / cpu_s:.0f} images per CPU-second; load average {os.getloadavg()[0]:.1f}")
    print(f"  bytes per image on the wire: {wire['device']:.0f} uint8 (finish_on=device), {wire['server']:.0f} "
          f"float32 (finish_on=server): {wire['server'] / wire['device']:.2f}x")
    report.write_json(args.json, {"benchmark": "images", "batch_size": args.batch_size,
                                  "ms_per_batch": prof.median_s * 1000, "images_per_s_per_core": per_core,
                                  "cpu_ms_per_batch": cpu_s * 1000, "images_per_cpu_s": args.batch_size / cpu_s,
                                  "bytes_per_image": wire, "profile": prof.times_s})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
