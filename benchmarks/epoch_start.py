"""What an epoch boundary costs a training loop: connections kept for the next epoch, or made again.

    flock /tmp/bench.lock python -m benchmarks.epoch_start --images-dir /tmp/sweep-photos --epochs 12

One ``hetero serve`` (2 workers) builds the image pipeline (photo-like JPEGs, fused crop decode,
flip, 64 px crops, batches of 32) for one job: a plain loop ``for epoch: ds.set_epoch(epoch); for
batch in ds`` with an emulated accelerator step after each batch, ``epochs`` not given (so
nothing of the next epoch is fetched ahead). Two ways, alternated epoch by epoch in one run on
the same server:

* **kept**: the connections the last epoch left open are taken over (``RemoteDataset``'s
  default: ``KEEP_OPEN_S``);
* **made again**: ``RemoteDataset.close()`` after each epoch, so each epoch connects again (a
  gRPC Hello, the data plane's handshake): what every epoch cost before connections were kept.

Reported: the first batch's wait of each epoch (median and largest), the later batches' median
wait, and the epoch's wall time, per way.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks.common import cli, report

PIPELINE = "data_service.pipelines.images:build_pipeline"


def one_epoch(ds, epoch: int, step_s: float) -> tuple[float, list[float], float]:
    """(first batch's wait, the later batches' waits, the epoch's wall time)."""
    ds.set_epoch(epoch)
    start = time.perf_counter()
    it = iter(ds)
    waits = []
    while True:
        asked = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - asked)
        time.sleep(step_s)
    return waits[0], waits[1:], time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images-dir", default="/tmp/sweep-photos")
    ap.add_argument("--images", type=int, default=512, help="images per epoch (batches of 32)")
    ap.add_argument("--epochs", type=int, default=12, help="epochs per way (they alternate)")
    ap.add_argument("--step-s", type=float, default=0.05, help="the emulated accelerator step")
    cli.add_json(ap)
    args = ap.parse_args(argv)
    from benchmarks.photos import write_photo_folder
    from dnn_worker import RemoteDataset
    from hetero.testing.processes import TOKEN, ServerProc

    write_photo_folder(args.images_dir, args.images)
    options = {"data_dir": args.images_dir, "limit": args.images, "batch_size": 32, "image_size": 64}
    server = ServerProc(options, workers=2, slots=4, pipeline=PIPELINE)
    server.start()
    figures: dict[str, dict[str, list]] = {w: {"first": [], "later": [], "epoch": []} for w in ("kept", "made again")}
    try:
        ds = RemoteDataset([server.address], TOKEN, seed=1, shared_memory=False, batch_timeout=60)
        one_epoch(ds, 0, args.step_s)  # imports, the workers' first batches: in neither way's figures
        for e in range(1, 2 * args.epochs + 1):
            way = "kept" if e % 2 else "made again"
            if way == "made again":
                ds.close()
            first, later, wall = one_epoch(ds, e, args.step_s)
            figures[way]["first"].append(first)
            figures[way]["later"] += later
            figures[way]["epoch"].append(wall)
        ds.close()
    finally:
        server.kill()
    print(f"{report.stamp()}: one job, {args.images} photo-like JPEGs an epoch (batches of 32 x 64 px), step "
          f"{args.step_s * 1000:.0f} ms, {args.epochs} epochs per way, alternated\n")
    print("| connections | first batch's wait, median ms | largest ms | later batches' wait, median ms | "
          "epoch s, median |")
    print("|---|---|---|---|---|")
    for way, f in figures.items():
        print(f"| {way} | {statistics.median(f['first']) * 1000:.1f} | {max(f['first']) * 1000:.1f} | "
              f"{statistics.median(f['later']) * 1000:.2f} | {statistics.median(f['epoch']):.3f} |")
    kept, again = (statistics.median(figures[w]["first"]) for w in ("kept", "made again"))
    print(f"\nAn epoch's first batch: {again * 1000:.1f} ms with connections made again, {kept * 1000:.1f} ms "
          f"kept ({again / max(kept, 1e-9):.1f}x)")
    report.write_json(args.json, {"command": report.command("python -m benchmarks.epoch_start", argv),
                                  "date": report.stamp(), "figures": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
