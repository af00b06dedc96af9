"""Shards in S3 against an image folder in S3: requests, bytes and images/s of the data nodes.

An S3-compatible store on loopback (moto's real HTTP server) sits behind a proxy that adds a
first-byte latency to every request (30 ms by default, in the range of S3's) and counts requests
and bytes for the whole cluster. On it:

* ``files/``: the photo-like JPEG folder, one object per image (what a FastFile channel reads:
  one GET per file, each paying the latency);
* ``shards/``: the same folder written by ``hetero prepare`` (tar shards + index).

Printed:

1. S3 requests and bytes per epoch, whole cluster: the folder read file by file, and the shards
   read by 1 and by 2 data nodes (separate caches, as separate machines have), against the
   minimum for the read size (shard bytes / range size) and the data set's bytes; then a second
   epoch, which should read nothing while the data fits the cache.
2. images/s of one data node running the image pipeline (decode, crop 224, flip, batch 32) on
   shards read from the latency-injected store (cold cache), on the same shards on local disk,
   and on the per-file folder (a subset: at 30 ms a GET it is slow), interleaved, median.

    python -m benchmarks.shards --work /tmp/sb --images 10000 --latency-ms 30
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import cli, report
from benchmarks.photos import write_photo_folder

PIPELINE = "data_service.pipelines.images:build_pipeline"
FILES_PIPELINE = "benchmarks.common.s3files:build_pipeline"
BUCKET = "bench"


def _prepare(work: Path, images: int, shard_size: str) -> Path:
    from data_service.shards.format import INDEX_NAME
    from data_service.storage import parse_size
    from data_service.prepare.writer import prepare

    n = write_photo_folder(work / "images", images)
    if n:
        print(f"wrote {n} photo-like JPEGs under {work / 'images'}", flush=True)
    shards = work / f"shards-{shard_size}"
    if not (shards / INDEX_NAME).exists():
        summary = prepare(str(work / "images"), str(shards), shard_size=parse_size(shard_size, "--shard-size"),
                          workers=os.cpu_count() or 1, progress=False)
        print("\n".join(summary.lines(str(shards))), flush=True)
    return shards


def _upload(srv, work: Path, shards: Path) -> None:
    from data_service.shards.format import INDEX_NAME
    from data_service.storage import S3Store

    client = srv.client(direct=True)
    client.create_bucket(Bucket=BUCKET)
    store = S3Store(f"s3://{BUCKET}/shards")
    for p in sorted(shards.iterdir()):
        if p.name != INDEX_NAME:
            store.write_file(p.name, str(p))
    store.write_file(INDEX_NAME, str(shards / INDEX_NAME))
    files = sorted((work / "images").glob("*/*.jpg"))

    def put(p: Path) -> None:
        client.put_object(Bucket=BUCKET, Key=f"files/{p.parent.name}/{p.name}", Body=p.read_bytes())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, files))


def _counters(proxy) -> tuple[int, int]:
    c = proxy.counters()
    return sum(c["requests"].values()), c["body_bytes"].get("GET", 0)


def _per_file_pass(srv) -> dict:
    """One epoch's reads of the per-file folder (no decode): a LIST, then one GET per file."""
    from data_service.storage import S3Store

    srv.proxy.reset_counters()
    store = S3Store(f"s3://{BUCKET}/files")
    keys = [k for k, _ in store.list(".jpg")]
    t = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        total = sum(len(b) for b in pool.map(store.read, keys))
    requests, nbytes = _counters(srv.proxy)
    return {"files": len(keys), "requests": requests, "bytes": nbytes, "data_bytes": total,
            "seconds_16_threads": round(time.monotonic() - t, 2)}


DATA_CPUS = ""  # taskset list for data nodes ("" = not pinned); set by main()


def _servers(n: int, options: dict, pipeline: str, workers: int, cache: Path | None, log_dir: Path) -> list:
    from hetero.testing import TOKEN, ServerProc

    procs = []
    for i in range(n):
        env = {"HETERO_CACHE_DIR": str(cache / f"node{i}")} if cache is not None else {}
        procs.append(ServerProc(options, pipeline=pipeline, workers=workers, slots=4, token=TOKEN, env=env,
                                log_path=log_dir / f"server-{len(list(log_dir.iterdir())) + i}.log"))
        if DATA_CPUS:  # the data node's cores are its own: the store and the consumer run elsewhere
            procs[-1].cmd = ["taskset", "-c", DATA_CPUS, *procs[-1].cmd]
    for p in procs:
        p.start(wait=False)
    for p in procs:
        p.wait_ready(timeout=300)
    return procs


def _epoch(addresses: list[str], epoch: int) -> tuple[int, float]:
    """(images, seconds) of one epoch read by one consumer."""
    from dnn_worker import RemoteDataset
    from hetero.testing import TOKEN

    ds = RemoteDataset(addresses, TOKEN, seed=0, connect_timeout=120)
    ds.set_epoch(epoch)
    images, t = 0, time.monotonic()
    for batch in ds:
        images += int(batch["label"].numel())
    return images, time.monotonic() - t


def _traffic(srv, shards: Path, nodes: int, workers: int, work: Path, batch: int) -> dict:
    """Requests and bytes of the whole cluster: start-up, epoch 0 (cold caches), epoch 1 (warm)."""
    import inspect

    from data_service.shards.dataset import ShardDataset

    from data_service.shards.indexfile import read_index

    index = read_index(str(shards))
    range_bytes = inspect.signature(ShardDataset).parameters["range_bytes"].default
    minimum = sum(-(-s.size // range_bytes) for s in index.shards)
    cache = work / "cache" / f"traffic-{nodes}"
    shutil.rmtree(cache, ignore_errors=True)
    srv.proxy.reset_counters()
    options = {"shards": f"s3://{BUCKET}/shards", "batch_size": batch}
    procs = _servers(nodes, options, PIPELINE, workers, cache, work / "logs")
    try:
        start = _counters(srv.proxy)
        srv.proxy.reset_counters()
        out = {"nodes": nodes, "startup_requests": start[0], "startup_bytes": start[1], "min_requests": minimum,
               "data_bytes": index.data_bytes, "shard_bytes": sum(s.size for s in index.shards)}
        for epoch in (0, 1):
            images, seconds = _epoch([p.address for p in procs], epoch)
            requests, nbytes = _counters(srv.proxy)
            srv.proxy.reset_counters()
            out[f"epoch{epoch}"] = {"images": images, "seconds": round(seconds, 2), "requests": requests,
                                    "bytes": nbytes}
        return out
    finally:
        for p in procs:
            p.stop()


def _throughput(srv, shards: Path, workers: int, work: Path, batch: int, repeats: int, per_file_limit: int,
                block_batches: list[int]) -> dict:
    """images/s of one data node: S3 shards (cold cache), local shards, per-file S3 (a subset); interleaved.

    ``block_batches``: further S3 runs with shuffle blocks of these many batches (the default is 32).
    """
    configs = {
        "shards_s3": (PIPELINE, {"shards": f"s3://{BUCKET}/shards", "batch_size": batch}),
        "shards_local": (PIPELINE, {"shards": str(shards), "batch_size": batch}),
        "files_s3": (FILES_PIPELINE, {"prefix": f"s3://{BUCKET}/files", "batch_size": batch,
                                      "limit": per_file_limit}),
    }
    for k in block_batches:
        configs[f"shards_s3_block{k}"] = (PIPELINE, {"shards": f"s3://{BUCKET}/shards", "batch_size": batch,
                                                     "shuffle_block": k * batch})
    rates: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(repeats):
        for name, (pipeline, options) in configs.items():
            cache = work / "cache" / f"rate-{name}-{r}"
            shutil.rmtree(cache, ignore_errors=True)
            procs = _servers(1, options, pipeline, workers, cache, work / "logs")
            try:
                images, seconds = _epoch([procs[0].address], 0)
            finally:
                procs[0].stop()
            rates[name].append(images / seconds)
            print(f"  {name} run {r + 1}: {images} images in {seconds:.1f}s = {images / seconds:.0f} images/s",
                  flush=True)
    return {k: {"runs": [round(x, 1) for x in v], "median": round(statistics.median(v), 1)} for k, v in rates.items()}


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--work", default="/tmp/hetero-shard-bench", help="photos, shards and caches go here (kept)")
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--shard-size", default="64MB")
    ap.add_argument("--latency-ms", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2, help="worker processes per data node")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--per-file-limit", type=int, default=1000, help="images of the per-file images/s run")
    ap.add_argument("--block-batches", default="", help="also time S3 shards with blocks of these many batches, "
                                                        "e.g. 8,128 (the default block is 32)")
    ap.add_argument("--skip", action="append", default=[], choices=["traffic", "throughput"])
    ap.add_argument("--data-cpus", default="1" if (os.cpu_count() or 1) > 1 else "",
                    help="pin data nodes here (taskset list; default 1) and this process (consumer, S3 server, proxy) "
                         "to the other cores, so the store's own CPU does not count against the data node")
    args = ap.parse_args(argv)
    global DATA_CPUS
    DATA_CPUS = args.data_cpus
    if DATA_CPUS:
        from hetero.local.tree import parse_cpus  # the list syntax of hetero local --data-cpus

        data = parse_cpus(DATA_CPUS)
        os.sched_setaffinity(0, (set(range(os.cpu_count() or 1)) - data) or data)
    from hetero.testing.s3server import s3_server

    work = Path(args.work)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    shards = _prepare(work, args.images, args.shard_size)
    results: dict = {"date": report.stamp(), "argv": sys.argv[1:],
                     "latency_ms": args.latency_ms, "data_cpus": DATA_CPUS,
                     "bench_cpus": sorted(os.sched_getaffinity(0))}
    with s3_server(latency_s=args.latency_ms / 1000) as srv, srv.environ():
        _upload(srv, work, shards)
        if "traffic" not in args.skip:
            results["per_file"] = pf = _per_file_pass(srv)
            print(f"per-file folder, one epoch's reads: {pf['requests']} requests, {pf['bytes'] / 1e6:.1f} MB "
                  f"({pf['files']} files)", flush=True)
            for nodes in (1, 2):
                t = results[f"shards_{nodes}_nodes"] = _traffic(srv, shards, nodes, args.workers, work,
                                                                args.batch_size)
                e0, e1 = t["epoch0"], t["epoch1"]
                print(f"shards, {nodes} data node(s): start-up {t['startup_requests']} requests; epoch 0 "
                      f"{e0['requests']} requests ({e0['requests'] / t['min_requests']:.2f}x the minimum "
                      f"{t['min_requests']}), {e0['bytes'] / 1e6:.1f} MB ({e0['bytes'] / t['data_bytes']:.3f}x the "
                      f"data set); epoch 1 {e1['requests']} requests, {e1['bytes']} bytes", flush=True)
        if "throughput" not in args.skip:
            print("images/s of one data node:", flush=True)
            blocks = [int(x) for x in args.block_batches.split(",") if x]
            results["throughput"] = tp = _throughput(srv, shards, args.workers, work, args.batch_size, args.repeats,
                                                     args.per_file_limit, blocks)
            local = tp["shards_local"]["median"]
            for name, v in tp.items():
                print(f"  {name}: median {v['median']} images/s ({v['median'] / local:.2f}x local shards)")
    report.write_json(work / "results.json", results)
    print(f"figures in {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
