"""Start-up of a data server at scale: server start to first batch, and memory per worker process.

For each size a synthetic shard prefix is built in ``--work``: sparse tar files (``truncate`` to
their size: no bytes on disk) of about ``--stride`` bytes a sample (ImageNet's ~110 KB), and an
index of the samples. Only the samples the first batches of epoch 0 read (computed from the same
plan the server uses) get bytes: a tiny real JPEG. Then a real ``hetero serve`` with the image
pipeline starts on the prefix, a consumer asks for epoch 0, and the benchmark records:

* ``ready_s``: process start to the server answering health checks;
* ``first_batch_s``: process start to the consumer holding its first batch (the consumer asks for
  the first ``--batches`` batches of epoch 0);
* ``consumer_epoch_start_s``: with the server up, a ``RemoteDataset`` (one rank) from ``iter()`` to
  its first batch (its epoch's millions of batches at 100 M samples are computed as it reaches them);
* RSS of each worker process after ``--batches`` batches (and USS: the pages it alone holds),
  against the same on a tiny data set (one block): the growth is what the index costs a worker.

Sizes: ``--samples 1280000,100000000`` with ``index.bin``, and ``--json 1280000`` with the
version-1 ``index.json`` for comparison. No LIST of the samples happens anywhere: the server
opens one index file and lists each shard folder once.

``--check`` starts no server: it times the check of every entry of each ``index.bin``
(``ShardIndex.check``, page cache warm) against one shard's check at its first use, the cost
that decides why the entries are checked per shard rather than at open.

    python -m benchmarks.index_scale --work /tmp/index-scale
    python -m benchmarks.index_scale --work /tmp/index-scale --samples 100000000 --json '' --check
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

PIPELINE = "data_service.pipelines.images:build_pipeline"
TINY = 4096  # samples of the baseline data set (one shuffle block of the default size)


def _jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(
        buf, format="JPEG", quality=80)
    return buf.getvalue()


def build(folder: Path, n: int, stride: int, shard_size: int, fmt: str) -> dict:
    """A prefix of ``n`` samples in sparse shards, with an ``index.bin`` (or ``index.json``)."""
    from data_service.shards.format import ShardIndex, ShardInfo
    from data_service.shards.indexfile import IndexWriter

    marker = folder / "built.json"
    if marker.exists():
        return json.loads(marker.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    per = max(1, shard_size // stride)
    length = len(_jpeg())
    shards = -(-n // per)
    info, cols = [], ([], [], [])
    with IndexWriter(str(folder)) as w:
        for k in range(shards):
            count = min(per, n - k * per)
            name, size = f"shard-{k:06d}.tar", count * stride + 1024
            with open(folder / name, "wb") as f:
                f.truncate(size)
            offsets = np.arange(count, dtype=np.int64) * stride + 512
            labels = (np.arange(k * per, k * per + count) % 1000).astype(np.int32)
            if fmt == "bin":
                w.add_shard(name, size, offsets, np.full(count, length, np.uint32), labels)
            else:
                info.append(ShardInfo(name, size, k * per, count))
                cols[0].append(offsets)
                cols[1].append(np.full(count, length, np.uint32))
                cols[2].append(labels)
        classes = [f"n{c:08d}" for c in range(1000)]
        if fmt == "bin":
            w.write_file(str(folder / "index.bin"), classes)
        else:
            index = ShardIndex(classes, info, *(np.concatenate(c) for c in cols))
            (folder / "index.json").write_bytes(index.to_json())
    facts = {"samples": n, "shards": shards, "format": fmt, "build_s": round(time.monotonic() - t, 1),
             "index_bytes": os.path.getsize(folder / ("index.bin" if fmt == "bin" else "index.json"))}
    marker.write_text(json.dumps(facts))
    return facts


def fill_first_batches(folder: Path, options: dict, batches: int, seed: int) -> int:
    """Write the JPEG at every sample the first ``batches`` batches of epoch 0 read; how many."""
    from data_service.contract.pipeline import PipelineSpec
    from data_service.contract.sampler import batch_indices
    from data_service.shards.indexfile import read_index

    pipe = PipelineSpec(PIPELINE, {**options, "shards": str(folder)}).load()
    cfg = pipe.epoch_shape()
    index = read_index(str(folder))
    data = _jpeg()
    wanted = sorted({i for b in range(min(batches, cfg.num_batches)) for i in batch_indices(cfg, seed, 0, b)})
    fds: dict[int, int] = {}
    try:
        for i in wanted:
            shard, offset, length, _ = index.sample(i)
            if shard not in fds:
                fds[shard] = os.open(folder / index.shards.name(shard), os.O_WRONLY)
            os.pwrite(fds[shard], data[:length], offset)
    finally:
        for fd in fds.values():
            os.close(fd)
    return len(wanted)


def measure(folder: Path, options: dict, workers: int, batches: int, log: Path) -> dict:
    """Start a server on ``folder``; time to ready and to the first batch; workers' memory after ``batches``."""
    import psutil

    from dnn_worker import RemoteDataset
    from hetero.testing import TOKEN, ServerProc

    srv = ServerProc({**options, "shards": str(folder)}, pipeline=PIPELINE, workers=workers, slots=2, token=TOKEN,
                     log_path=log)
    t0 = time.monotonic()
    srv.start(wait=False)
    try:
        srv.wait_ready(timeout=600)
        ready = time.monotonic() - t0
        ds = RemoteDataset([srv.address], TOKEN, seed=0, connect_timeout=120)
        # the first batches of epoch 0, as a consumer asks for them (without its whole epoch's list)
        it = ds._batches([(0, i) for i in range(batches)])
        next(it)
        first = time.monotonic() - t0
        for _ in range(batches - 1):
            next(it)
        time.sleep(0.5)
        rss, uss = [], []
        for pid in srv.worker_pids():
            mem = psutil.Process(pid).memory_full_info()
            rss.append(mem.rss)
            uss.append(mem.uss)
        main = psutil.Process(srv.proc.pid).memory_info().rss
        it.close()
        # a whole epoch as RemoteDataset iterates it (one rank): the consumer lists every batch first
        epoch = RemoteDataset([srv.address], TOKEN, seed=0, connect_timeout=120)
        epoch.set_epoch(0)
        t = time.monotonic()
        whole = iter(epoch)
        next(whole)
        consumer_epoch = time.monotonic() - t
        del whole
    finally:
        srv.stop()
    return {"ready_s": round(ready, 2), "first_batch_s": round(first, 2),
            "consumer_epoch_start_s": round(consumer_epoch, 2), "workers": len(rss),
            "worker_rss_mb": round(statistics.mean(rss) / 1e6, 1),
            "worker_uss_mb": round(statistics.mean(uss) / 1e6, 1),
            "main_rss_mb": round(main / 1e6, 1)}


def check_cost(folder: Path, repeat: int) -> dict:
    """Seconds to check every entry of ``folder``'s index.bin (median of ``repeat``), and one shard's first use."""
    from data_service.shards.indexfile import open_index_file

    whole, shard = [], []
    for _ in range(max(1, repeat)):
        index = open_index_file(str(folder / "index.bin"))
        t = time.perf_counter()
        index.check()
        whole.append(time.perf_counter() - t)
        index = open_index_file(str(folder / "index.bin"))
        t = time.perf_counter()
        index.sample(len(index) // 2)
        shard.append(time.perf_counter() - t)
    return {"samples": len(index), "shards": len(index.shards), "whole_check_s": round(statistics.median(whole), 2),
            "first_use_of_a_shard_us": round(statistics.median(shard) * 1e6)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="folder for the synthetic prefixes (sparse: little disk)")
    p.add_argument("--samples", default="1280000,100000000", help="sizes with index.bin, comma separated")
    p.add_argument("--json", default="1280000", help="sizes with index.json, comma separated ('' = none)")
    p.add_argument("--stride", type=int, default=110_000, help="bytes a sample takes in its shard")
    p.add_argument("--shard-size", type=int, default=256_000_000)
    p.add_argument("--workers", type=int, default=2, help="worker processes of the data server")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=64, help="batches read before the memory is taken")
    p.add_argument("--repeat", type=int, default=2, help="starts per size (the median is printed)")
    p.add_argument("--check", action="store_true", help="time the index's entry checks only (no server)")
    args = p.parse_args(argv)
    work = Path(args.work)
    if args.check:
        for n in (int(n) for n in args.samples.split(",") if n):
            folder = work / f"bin-{n}"
            build(folder, n, args.stride, args.shard_size, "bin")
            print(json.dumps(check_cost(folder, max(3, args.repeat))), flush=True)
        return 0
    (work / "logs").mkdir(parents=True, exist_ok=True)
    options = {"batch_size": args.batch, "image_size": 32}
    cases = [("tiny", TINY, "bin")] + [(f"{int(n):,}", int(n), "bin") for n in args.samples.split(",") if n] + \
        [(f"{int(n):,}", int(n), "json") for n in args.json.split(",") if n]
    rows = []
    base = None
    for label, n, fmt in cases:
        folder = work / f"{fmt}-{n}"
        facts = build(folder, n, args.stride, args.shard_size, fmt)
        fill_first_batches(folder, options, batches=8 * args.workers + args.batches + 64, seed=0)
        runs = [measure(folder, options, args.workers, args.batches, work / "logs" / f"{fmt}-{n}.log")
                for _ in range(args.repeat)]
        row = {"case": label, **facts, **{k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}}
        if base is None:
            base = row
        row["worker_rss_growth_mb"] = round(row["worker_rss_mb"] - base["worker_rss_mb"], 1)
        row["worker_uss_growth_mb"] = round(row["worker_uss_mb"] - base["worker_uss_mb"], 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print(f"{'samples':>12} {'index':>6} {'index MB':>9} {'shards':>7} {'ready s':>8} {'1st batch s':>11} "
          f"{'epoch start s':>13} {'worker RSS MB':>13} {'growth':>7} {'USS growth':>10}")
    for r in rows:
        print(f"{r['case']:>12} {r['format']:>6} {r['index_bytes'] / 1e6:>9.1f} {r['shards']:>7} {r['ready_s']:>8} "
              f"{r['first_batch_s']:>11} {r['consumer_epoch_start_s']:>13} {r['worker_rss_mb']:>13} "
              f"{r['worker_rss_growth_mb']:>7} {r['worker_uss_growth_mb']:>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
