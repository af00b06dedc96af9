"""The corruption campaign: bytes flipped or cut in every place a sample passes, and what training sees.

    python -m benchmarks.corruption [--trials 200] [--seed 0] [--images 96] [--only PLACE,...] [--json out.json]

Each trial damages one place, runs one epoch of the image pipeline from two data servers (``hetero
serve`` processes) into one in-process consumer with an audit log, and compares each batch's
digest with the batch built in-process from the clean data. A trial is **detected** (an error
naming the file or sample, or a counted skip: the server's ``samples_skipped``), **silent** (a
batch whose bytes differ from the clean one, nothing detected), **re-read** (the damage was read,
failed its check and the source gave the right bytes: ``samples_reread``) or **harmless** (every
batch as the clean one, nothing read again: a byte nothing reads, such as tar padding). **lost**
counts whole samples missing besides the damaged ones.

The places: ``local`` (``hetero prepare`` shards, flips and cuts), ``wds`` (WebDataset tars indexed
by ``hetero index``), ``index`` (index.bin's per-sample columns, damaged before the servers open
it), ``cache`` (a block of S3 shards in the node's cache), ``s3`` (the S3 object itself, read
through the S3 fault proxy, which answers 503 once per trial), ``parquet`` (a row group's pages),
``decoded`` (an entry of the decoded-image cache, between epochs), ``parquet-plain`` (a row group's
pages in a file written with pyarrow's defaults, no page CRCs, checked by the row checksums ``hetero
index`` writes), ``dataplane`` (a byte of what one server sends, flipped by a proxy), ``label_manifest`` (a label
changed in a part's manifest before ``hetero prepare --merge``; every other trial the manifest's
own checksum made to match, so the per-sample checksum must see it), ``label_index`` (a label changed
in index.bin under servers that opened it and read every sample once), ``running`` (a shard cut
short mid-epoch under running servers, ``on_corrupt=skip``: :mod:`benchmarks.common.corrupt_running`)
and ``request`` (a byte of what
the consumer sends one server: its hello, requests, hints; each trial's seconds are kept, since a
damaged request must be asked again at once, not after ``batch_timeout``:
``benchmarks/common/request_place.py``). Servers are started once
per data set and reused: damage is done in place, so the files they hold open see it, and undone
after the trial; where a first read has already cached the clean bytes (the S3 block cache, decoded
Parquet row groups), the cached copy is damaged alike, as a first read of the damaged source would
have left it. **stored** sums the places whose bytes carry a checksum; the data plane's frames carry
none.
"""
from __future__ import annotations

import collections
import logging
import os
import random
import tempfile
import time

from benchmarks.common import cli, report
from benchmarks.common import corrupt as cc
from benchmarks.common import corrupt_running, request_place

BASE = {"batch_size": 8, "image_size": 32, "shuffle_block": 32, "drop_last": True}
SHARE = {"local": 0.25, "wds": 0.15, "index": 0.05, "cache": 0.2, "s3": 0.1, "parquet": 0.05, "dataplane": 0.2,
         "label_manifest": 0.05, "label_index": 0.05, "request": 0.1, "decoded": 0.1, "parquet-plain": 0.05,
         corrupt_running.PLACE: 0.1}
STORED = ("local", "wds", "index", "cache", "s3", "parquet", "decoded", "parquet-plain",
          "label_manifest", "label_index")  # places whose bytes carry a checksum
OUTCOMES = ("detected", "silent", "reread", "harmless")


def _stats(servers) -> tuple[int, int]:
    from dnn_worker.transport.control import ControlClient

    skipped = reread = 0
    for s in servers:
        with ControlClient(s.address, s.token) as ctl:
            st = ctl.stats(timeout=10)
        skipped += st.samples_skipped
        reread += int(dict(st.pipeline).get("samples_reread", 0))
    return skipped, reread


class _Named(logging.Handler):
    """Keeps the first warning that names a batch failing its checksum, or a frame that does not parse
    (the consumer then asks for the batch again)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said = ""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        # a flip in a frame's length or header ends the connection as a protocol error instead
        if not self.said and ("CRC32C" in message or "CRC-32" in message or "ProtocolError" in message or "DecodeError" in message):
            self.said = message[:300]


def epoch(servers, ref: list[str], seed: int, audit: str, damaged: int = 0) -> dict:
    """One epoch from ``servers`` compared batch by batch with ``ref``; the trial's outcome."""
    from data_service.contract.tensor_layout import batch_digest
    from dnn_worker import RemoteDataset

    before = _stats(servers)
    error, short, silent, got = "", 0, 0, 0
    named = _Named()  # the consumer's own detection: a batch that fails its CRC32C on arrival
    logging.getLogger("dnn_worker").addHandler(named)
    try:
        ds = RemoteDataset([s.address for s in servers], servers[0].token, seed=seed, audit_path=audit,
                           connect_timeout=20, batch_timeout=20,
                           shared_memory=False)  # the bytes cross the network, as between two hosts
        for b, batch in enumerate(ds):
            n = len(batch[1]) if isinstance(batch, (tuple, list)) else len(next(iter(batch.values())))
            got += 1
            short += BASE["batch_size"] - n
            if batch_digest(batch) != ref[b] and n == BASE["batch_size"]:
                silent += 1
    except Exception as exc:  # the detection under on_corrupt=fail: it must name the damage
        error = " ".join(str(exc).split()).split(" --- original traceback")[0][:300]
    finally:
        logging.getLogger("dnn_worker").removeHandler(named)
    skipped, reread = (a - b for a, b in zip(_stats(servers), before))
    raised, error = error, error or named.said
    detected = bool(error) or skipped > 0
    outcome = "silent" if silent else "detected" if detected else "reread" if reread else "harmless"
    if not raised and got != len(ref):
        outcome = "silent"  # batches missing without an error: never acceptable
    return {"outcome": outcome, "error": error, "skipped": skipped, "reread": reread,
            "lost": max(0, short - damaged) if not raised else 0, "batches": got}


def _index_trials(count: int, rng: random.Random, options: dict, seed: int, audit: str, results: list) -> None:
    """index.bin damaged before the servers open it (as a bad copy would be): a pair started per trial."""
    from hetero.testing import Reference

    if not count:
        return
    ref = Reference(cc.PIPELINE, options, seed).digests(0)
    for _ in range(count):
        damage, damaged = cc.index_damage(rng, options["shards"])
        try:
            try:
                servers, _ = _pair(options)
            except RuntimeError as exc:  # refused at start, the log naming the index
                said = [ln for ln in str(exc).splitlines() if "Error" in ln]
                results.append({"place": "index", "outcome": "detected", "error": (said or [str(exc)])[-1][:300],
                                "skipped": 0, "reread": 0, "lost": 0, "batches": 0})
                continue
            try:
                results.append(dict(epoch(servers, ref, seed, audit, damaged), place="index"))
            finally:
                for s in servers:
                    s.stop()
        finally:
            for d in damage:
                d.undo()


def _label_trials(counts, rng: random.Random, options: dict, files, photos: str, work: str, seed: int, audit: str,
                  results: list) -> None:
    """Labels: changed in a part's manifest before ``--merge`` (a merged copy per trial: refused at the
    merge, else a pair of servers on it), and in index.bin under the running pair of ``options``."""
    import shutil

    from data_service.errors import ConfigError
    from data_service.prepare.writer import merge_parts
    from hetero.testing import Reference

    classes = len({label for _, label in files})
    if counts["label_manifest"]:
        parts = cc.prepared_parts(photos, os.path.join(work, "parts"))
        ref = Reference(cc.PIPELINE, options, seed).digests(0)
        for t in range(counts["label_manifest"]):
            trial = os.path.join(work, f"label-manifest-{t}")
            shutil.rmtree(trial, ignore_errors=True)
            shutil.copytree(parts, trial)
            try:
                how = "resealed" if t % 2 else "plain"  # every other trial: damage only a read can see
                _, damaged = cc.label_manifest_damage(rng, trial, classes, resealed=t % 2 == 1)
                try:
                    merge_parts(trial)
                except ConfigError as exc:  # the manifest's own checksum: named at the merge
                    results.append({"place": "label_manifest", "outcome": "detected", "error": str(exc)[:300],
                                    "skipped": 0, "reread": 0, "lost": 0, "batches": 0, "damage": how})
                    continue
                servers, _ = _pair(dict(options, shards=trial))
                try:
                    results.append(dict(epoch(servers, ref, seed, audit, damaged), place="label_manifest",
                                        damage=how))
                finally:
                    for s in servers:
                        s.stop()
            finally:
                shutil.rmtree(trial, ignore_errors=True)
    if counts["label_index"]:
        _run_pair(options, options, {"label_index": counts["label_index"]},
                  lambda p, f: cc.label_index_damage(rng, options["shards"]), seed, audit, results)


def _pair(options: dict, env: dict | None = None, proxy: bool = False):
    from hetero.testing import ServerProc, free_port

    bulk = free_port()
    flip = cc.FlipProxy(("127.0.0.1", bulk)) if proxy else None
    servers = [ServerProc(options, pipeline=cc.PIPELINE, env=env),
               ServerProc(options, pipeline=cc.PIPELINE, env=env, bulk_port=bulk,
                          advertise_bulk_port=flip.port if flip else 0)]
    for s in servers:
        s.start(wait=False)
    for s in servers:
        s.wait_ready(180)
    return servers, flip


def _places(trials: int, only: tuple[str, ...] = ()) -> dict[str, int]:
    shares = {p: share for p, share in SHARE.items() if not only or p in only}
    counts = {p: max(1, round(trials * share / sum(shares.values()))) for p, share in shares.items()}
    counts[next(iter(counts))] += trials - sum(counts.values())
    return collections.defaultdict(int, counts)


def _run_pair(options, ref_options, places, make, seed, audit, results, env=None, after=None, heal=False):
    """Start a pair of servers for one data set and run ``places``' trials on it."""
    from hetero.testing import Reference

    if not sum(places.values()):
        return
    ref = Reference(cc.PIPELINE, ref_options, seed).digests(0)
    servers, flip = _pair(options, env=env, proxy="dataplane" in places)
    try:
        epoch(servers, ref, seed, audit)  # warm: the caches hold the clean data before any damage
        for place, count in places.items():
            for _ in range(count):
                damage, damaged = make(place, flip)
                try:
                    r = epoch(servers, ref, seed, audit, damaged)
                finally:
                    for d in reversed(damage):
                        d.undo()
                r["place"] = place
                if place == "dataplane" and not flip.flipped:
                    r["outcome"] = "harmless"  # the flip lay past the epoch's last byte
                results.append(r)
                if after is not None and r["outcome"] != "harmless":
                    servers = after(servers)
                elif heal:
                    epoch(servers, ref, seed, audit)  # a damaged copy left in the cache is read again, dropped
    finally:
        for s in servers:
            s.stop()
        if flip:
            flip.close()


def run(trials: int = 200, seed: int = 0, images: int = 96, work: str = "", only: tuple[str, ...] = (),
        trace: list | None = None) -> dict:
    """The campaign: ``trials`` trials spread over the places (:data:`SHARE`); per place the outcomes."""
    from hetero.testing.s3server import s3_server

    rng = random.Random(seed)
    counts = _places(trials, only)
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="corruption-") as tmp:
        work = work or tmp
        files = cc.photos(os.path.join(work, "photos"), images)
        shards = cc.prepared(os.path.join(work, "photos"), os.path.join(work, "shards"))
        wds = cc.webdataset(files, os.path.join(work, "wds"))
        pqfile = cc.parquet(files, os.path.join(work, "pq"))
        audit = os.path.join(tmp, "audit.jsonl")

        def local(place, flip):
            if place == "dataplane":
                flip.flipped = 0
                flip.arm(rng.randrange(120_000), 1 << rng.randrange(8))
                return [], 0
            return cc.shard_damage(rng, shards)

        opts = dict(BASE, shards=shards, on_corrupt="skip")
        _run_pair(opts, opts, {p: counts[p] for p in ("local", "dataplane")}, local, seed, audit, results)
        _index_trials(counts["index"], rng, opts, seed, audit, results)
        _label_trials(counts, rng, opts, files, os.path.join(work, "photos"), work, seed, audit, results)
        request_place.trials(counts["request"], rng, opts, seed, audit, results, _pair, epoch)
        opts = dict(BASE, shards=wds, on_corrupt="fail")
        _run_pair(opts, opts, {"wds": counts["wds"]}, lambda p, f: cc.shard_damage(rng, wds), seed, audit,
                  results)
        cache = os.path.join(tmp, "s3cache")
        with s3_server() as srv:
            client = srv.client(direct=True)
            client.create_bucket(Bucket="campaign")
            for f in os.listdir(shards):
                client.upload_file(os.path.join(shards, f), "campaign", f"shards/{f}")

            def s3(place, flip):
                srv.proxy.fail_next("503", count=1)  # and S3 slows down once: the re-read retries
                return cc.cached_damage(rng, shards, cache, BASE["shuffle_block"],
                                        (client, "campaign", "shards") if place == "s3" else None)

            opts = dict(BASE, shards="s3://campaign/shards", cache_dir=cache, on_corrupt="skip")
            _run_pair(opts, dict(BASE, shards=shards), {"cache": counts["cache"], "s3": counts["s3"]}, s3,
                      seed, audit, results, env=dict(srv.env), heal=True)
        pcache = os.path.join(tmp, "pqcache")
        opts = dict(BASE, parquet=pqfile, cache_dir=pcache, on_corrupt="fail")

        def fresh(servers):  # a row group that failed stays failed in the node's cache: start clean
            for s in servers:
                s.stop()
            import shutil

            shutil.rmtree(pcache, ignore_errors=True)
            return _pair(opts)[0]

        _run_pair(opts, dict(BASE, parquet=pqfile), {"parquet": counts["parquet"]},
                  lambda p, f: cc.parquet_damage(rng, pqfile, pcache), seed, audit, results, after=fresh)
        _cached_images_and_plain_parquet(counts, rng, files, shards, work, tmp, seed, audit, results)
        corrupt_running.trials(counts[corrupt_running.PLACE], rng, shards, work, BASE, seed, audit, results)
    if trace is not None:
        trace.extend(results)
    return summarize(results)


def _cached_images_and_plain_parquet(counts, rng, files, shards, work, tmp, seed, audit, results) -> None:
    """The ``decoded`` trials (an entry of the decoded-image cache damaged between epochs: each must be
    re-read) and the ``parquet-plain`` ones (a file without page CRCs, its rows checked by the
    checksums ``hetero index`` wrote; ``on_corrupt=skip``, so each damaged row is a counted skip)."""
    opts = dict(BASE, shards=shards, on_corrupt="skip", decoded_cache_bytes="64MB",
                decoded_cache_dir=os.path.join(tmp, "decoded"))
    _run_pair(opts, opts, {"decoded": counts["decoded"]},
              lambda p, f: cc.decoded_damage(rng, os.path.join(tmp, "decoded")), seed, audit, results)
    if not counts["parquet-plain"]:
        return
    plain = cc.plain_parquet(files, os.path.join(work, "pq-plain"))
    cache = os.path.join(tmp, "pq-plain-cache")
    opts = dict(BASE, parquet=plain, cache_dir=cache, on_corrupt="skip", unchecked="refuse")

    def fresh(servers):  # a row found damaged stays marked in the node's cache: start clean
        import shutil

        for s in servers:
            s.stop()
        shutil.rmtree(cache, ignore_errors=True)
        return _pair(opts)[0]

    _run_pair(opts, dict(BASE, parquet=plain), {"parquet-plain": counts["parquet-plain"]},
              lambda p, f: cc.plain_parquet_damage(rng, plain, cache), seed, audit, results, after=fresh)


def summarize(results: list[dict]) -> dict:
    """Per place, then over the stored places (a checksum guards them), then over all: the outcomes."""
    table: dict[str, dict] = {}
    stored = [dict(r, place="stored") for r in results if r["place"] in STORED]
    for r in sorted(results, key=lambda r: list(SHARE).index(r["place"])) + stored + \
            [dict(r, place="total") for r in results]:
        row = table.setdefault(r["place"], dict({k: 0 for k in OUTCOMES}, trials=0, lost=0, errors=[]))
        row["trials"] += 1
        row[r["outcome"]] += 1
        row["lost"] += r["lost"]
        if r["error"] and len(row["errors"]) < 2:
            row["errors"].append(r["error"])
    return table


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, prog="python -m benchmarks.corruption")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--images", type=int, default=96)
    p.add_argument("--only", default="", metavar="PLACE,...",
                   help=f"run only these places' trials (of {', '.join(SHARE)}), --trials spread over them")
    cli.add_json(p)
    args = p.parse_args(argv)
    only = tuple(x.strip() for x in args.only.split(",") if x.strip())
    unknown = [x for x in only if x not in SHARE]
    if unknown:
        p.error(f"--only {args.only}: no place {', '.join(unknown)}; the places are {', '.join(SHARE)}")
    start = time.monotonic()
    trace: list[dict] = []
    table = run(args.trials, args.seed, args.images, only=only, trace=trace)
    print(f"{report.command('python -m benchmarks.corruption', argv)}  ({report.stamp()}, "
          f"{time.monotonic() - start:.0f} s)")
    print(f"{'place':<14} {'trials':>6} {'detected':>8} {'silent':>6} {'re-read':>7} {'harmless':>8} {'lost':>4}")
    for place, row in table.items():
        print(f"{place:<14} {row['trials']:>6} {row['detected']:>8} {row['silent']:>6} {row['reread']:>7} "
              f"{row['harmless']:>8} {row['lost']:>4}")
    for place, row in table.items():
        for e in row["errors"][:1] if place in SHARE else []:
            print(f"  {place}: e.g. {e}")
    if request_place.times(trace):
        print(request_place.times(trace))
    report.write_json(args.json, {"benchmark": "corruption", "date": report.stamp(), "table": table,
                                  "request_seconds": [r["seconds"] for r in trace if r["place"] == "request"],
                                  "command": report.command("python -m benchmarks.corruption", argv)})
    return 1 if table["total"]["silent"] or table["total"]["lost"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
