"""``hetero prepare``'s images/s per core, on a folder of photo-like JPEGs (``benchmarks.photos``).

Each run writes the folder as shards into a fresh local DEST with ``--workers W`` (every file read,
decoded once to check it, and written into a tar); the figure is images/s and images/s per worker.
``--max-side`` adds the re-encode of the images larger than it.

    python -m benchmarks.prepare_rate --work /tmp/prep-rate --images 2000
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from benchmarks.photos import write_photo_folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--workers", default="1,2", help="worker counts, comma separated")
    p.add_argument("--max-side", type=int, default=0)
    args = p.parse_args(argv)
    from data_service.prepare.writer import prepare

    work = Path(args.work)
    write_photo_folder(work / "images", args.images)
    src_bytes = sum(f.stat().st_size for f in (work / "images").glob("*/*.jpg"))
    for w in (int(x) for x in args.workers.split(",")):
        dest = work / f"out-{w}"
        shutil.rmtree(dest, ignore_errors=True)
        t = time.monotonic()
        summary = prepare(str(work / "images"), str(dest), shard_size=64_000_000, workers=w, progress=False,
                          max_side=args.max_side)
        seconds = time.monotonic() - t
        print(json.dumps({"workers": w, "images": summary.samples, "seconds": round(seconds, 2),
                          "images_per_s": round(summary.samples / seconds, 1),
                          "images_per_s_per_worker": round(summary.samples / seconds / w, 1),
                          "mean_kb": round(src_bytes / max(1, summary.samples) / 1e3, 1),
                          "reencoded": summary.reencoded, "max_side": args.max_side}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
