"""``hetero prepare``: write an image folder (or any map-style data set) as shards plus an index.

The output (``data_service.shards.format``) is WebDataset-compatible tar shards of about
``shard_size`` bytes and an ``index.json``, in a local folder or under an ``s3://`` prefix. Samples
are shuffled once here (a fixed seed) so that every shard, and every block of consecutive
samples a data node reads, is a random draw of the data set: block-wise shuffling at training time
then mixes classes as a full shuffle does (docs/shards.md).

Each file is checked on the way in: its bytes are decoded once with the decoder the pipeline uses.
Files that decode are carried over byte for byte (CMYK, grayscale, progressive, RGBA, palette PNG,
a PNG named .JPEG: they decode exactly as from the folder), unless ``max_side`` asks to re-encode
those whose long side is larger (JPEG, quality 95, antialiased resize). Files that do not decode
are skipped and listed with the reason.
"""
from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import tarfile
import threading
import time

import numpy as np

from ..errors import ConfigError
from ..shards.format import INDEX_NAME, JSON_INDEX_NAME, SHARD_PATTERN, padded
from ..storage import open_store

from .plan import (PLAN, WORK, Plan, Summary, finished, items_digest, manifest, manifest_key, merge,
                   parse_part, per_shard, read_plan)
log = logging.getLogger(__name__)

MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF8", "gif"), (b"RIFF", "webp"))


# -- the per-file work, in worker processes
_SOURCE = None  # the import-path data set of this worker process, when the source is one


def _init_worker(target: str, options: dict) -> None:
    global _SOURCE
    import torch

    torch.set_num_threads(1)
    _SOURCE = _load_dataset(target, options) if target else None  # None: files of a folder


def _load_dataset(target: str, options: dict):
    from ..contract.pipeline import PipelineSpec

    dataset = PipelineSpec(target, options).resolve()(**options)
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise ConfigError(f"{target} returned {type(dataset).__name__}, not a map-style data set "
                          "(__len__ and __getitem__ giving (image bytes or uint8 [C, H, W] tensor, label))")
    return dataset


def _convert(job: tuple[int, str, int, int, bool]) -> tuple[int, str, bytes, int, str, bool]:
    """(position, member extension, bytes, label, why skipped, re-encoded) for one item."""
    import torch

    from ..pipelines.images import CorruptImageError, decode_bytes

    pos, path, label, max_side, verify = job
    try:
        if _SOURCE is not None:
            item, label = _SOURCE[int(path)]
            if isinstance(item, torch.Tensor):
                from torchvision.io import encode_png

                item = encode_png(item.to(torch.uint8).contiguous()).numpy().tobytes()
            data = bytes(item)
        else:
            with open(path, "rb") as f:
                data = f.read()
        ext = next((e for magic, e in MAGIC if data.startswith(magic)), "")
        image = decode_bytes(data, path) if (verify or max_side) else None
        if not ext:
            ext = "jpg"  # decodes, but not by a known signature: keep the bytes, name it as most are
    except CorruptImageError as exc:
        return pos, "", b"", int(label), str(exc), False
    except OSError as exc:
        return pos, "", b"", int(label), f"cannot read ({exc})", False
    if max_side and image is not None and max(image.shape[1:]) > max_side:
        from torchvision.io import encode_jpeg
        from torchvision.transforms.v2 import functional as F

        h, w = image.shape[1:]
        scale = max_side / max(h, w)
        small = F.resize(image, [max(1, round(h * scale)), max(1, round(w * scale))], antialias=True)
        return pos, "jpg", encode_jpeg(small, quality=95).numpy().tobytes(), int(label), "", True
    return pos, ext, data, int(label), "", False


# -- writing
class _Shard:
    """One tar file being written (shard ``k``); records where each sample's data lies in it."""

    def __init__(self, folder: str, k: int) -> None:
        self.k, self.name = k, SHARD_PATTERN.format(k)
        self.path = os.path.join(folder, self.name)
        self.tar = tarfile.open(self.path, "w", format=tarfile.USTAR_FORMAT)
        self.offsets, self.lengths, self.labels = [], [], []
        self.skipped: list[tuple[str, str]] = []
        self.reencoded = 0

    def add(self, key: str, ext: str, data: bytes, label: int) -> None:
        self._member(f"{key}.{ext}", data)
        self.offsets.append(self.tar.offset - padded(len(data)))
        self.lengths.append(len(data))
        self.labels.append(label)
        self._member(f"{key}.cls", str(label).encode())

    def _member(self, name: str, data: bytes) -> None:
        import io

        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o444, "", ""
        self.tar.addfile(info, io.BytesIO(data))

    def close(self) -> bytes:
        """Close the tar; the shard's manifest (``data_service.prepare.plan.manifest``)."""
        self.tar.close()
        return manifest(self.name, os.path.getsize(self.path), self.offsets, self.lengths, self.labels,
                        self.skipped, self.reencoded)


def _sources(src: str, options: dict) -> tuple[list[str], list[tuple[str, int]], str]:
    """(classes, [(path or item number, label)], import target) of SRC."""
    if ":" in src and not os.path.exists(src) and "/" not in src.split(":")[0]:
        dataset = _load_dataset(src, options)
        classes = [str(c) for c in getattr(dataset, "classes", [])]
        return classes, [(str(i), 0) for i in range(len(dataset))], src
    from ..pipelines.images import scan

    classes, samples = scan(src)
    return classes, samples, ""


class _Uploads:
    """Stores each finished shard under its name (a folder renames it into place, S3 uploads it)
    and then its manifest, at most four at once so local staging stays bounded."""

    def __init__(self, store) -> None:
        self.store = store
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def add(self, path: str, name: str, after: tuple[str, bytes]) -> None:
        """Store ``path`` as ``name``, then write ``after`` (key, bytes): the shard's manifest comes second."""
        def upload():
            try:
                self.store.write_file(name, path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self.store.write_bytes(*after)
            except BaseException as exc:  # reported after the last shard
                self.errors.append(exc)
        while len([t for t in self.threads if t.is_alive()]) >= 4:
            time.sleep(0.05)
        t = threading.Thread(target=upload, name=f"upload {name}", daemon=True)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        """Wait for every upload; raise the first one's error."""
        for t in self.threads:
            t.join()
        if self.errors:
            raise self.errors[0]


def _converted(jobs: list, target: str, options: dict, workers: int, progress: bool):
    """``_convert``'s results for ``jobs``, in order, from ``workers`` processes (one: this one)."""
    if not jobs:  # every shard of this part is finished
        return
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), unit="img", desc="prepare", mininterval=0.5)
    try:
        with contextlib.ExitStack() as stack:
            if workers == 1:  # in this process: no pool to start
                _init_worker(target, options)
                results = map(_convert, jobs)
            else:
                pool = stack.enter_context(mp.get_context("spawn").Pool(workers, _init_worker, (target, options)))
                results = pool.imap(_convert, jobs, chunksize=16)
            for result in results:
                if bar is not None:
                    bar.update(1)
                yield result
    finally:
        if bar is not None:
            bar.close()


def prepare(src: str, dest: str, *, shard_size: int = 256 * 1000**2, max_side: int = 0, workers: int = 0,
            shuffle_seed: int | None = 0, overwrite: bool = False, verify: bool = True, progress: bool = True,
            options: dict | None = None, part: tuple[int, int] | str | None = None) -> Summary:
    """Write ``src`` (an image folder, or ``pkg.mod:fn`` returning a map-style data set) as shards in ``dest``.

    Shard ``k`` holds the same samples whichever machine writes it (``data_service.prepare.plan``); a run
    that stopped keeps the shards it finished when started again with the same options.

    Args:
        shard_size: bytes per tar file, about (the samples per shard are chosen from the source's sizes).
        max_side: re-encode images whose long side exceeds this many pixels (0: keep every file as is).
        workers: processes that read and check files (0: every core).
        shuffle_seed: the order samples are written in is a permutation seeded by this (None: in
            the source's order, classes one after another).
        overwrite: replace shards (or an unfinished run with other options) already at ``dest``.
        verify: decode every image once and skip those that do not decode.
        options: keyword options of an import-path source.
        part: ``(i, N)`` or ``"i/N"``: write only part ``i`` of ``N`` disjoint parts of the shards
            and no index (:func:`merge_parts` writes it once every part is done). None: all, and the index.

    Raises:
        ConfigError: bad options, an empty source, or ``dest`` already holding shards (or a run
            with other options).
    """
    start = time.monotonic()
    if shard_size < 1_000_000:
        raise ConfigError(f"shard_size={shard_size} bytes is below 1 MB: shards that small cost one request "
                          "each; use 64MB to 1GB")
    if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < 0:
        raise ConfigError(f"max_side={max_side!r} must be an integer >= 0 (0 = keep every image as it is)")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ConfigError(f"workers={workers} must be >= 1")
    if isinstance(part, str):
        part = parse_part(part)
    options = dict(options or {})
    store = open_store(dest, what="dest", create=True)
    classes, items, target = _sources(src, options)
    if not items:
        raise ConfigError(f"{src} holds no samples")
    order = np.arange(len(items)) if shuffle_seed is None else \
        np.random.Generator(np.random.PCG64(shuffle_seed)).permutation(len(items))
    plan = Plan(len(items), per_shard(shard_size, _sizes(items, order, target, options)), shuffle_seed, max_side,
                verify, tuple(classes), items_digest(items, "" if target else src) if not target
                else f"{target}:{len(items)}:{json.dumps(options, sort_keys=True)}")
    _claim(store, dest, plan, overwrite)
    done = finished(store)
    todo = [k for k in plan.part_shards(part) if k not in done]
    summary = Summary(part=f"{part[0]}/{part[1]}" if part else "", kept=len(plan.part_shards(part)) - len(todo))
    jobs = [(pos, items[order[pos]][0], items[order[pos]][1], max_side, verify)
            for k in todo for pos in range(k * plan.per_shard, min(plan.samples, (k + 1) * plan.per_shard))]
    with store.staging() as staging:
        uploads = _Uploads(store)
        shard: _Shard | None = None
        try:
            with contextlib.closing(_converted(jobs, target, options, workers, progress)) as results:
                for pos, ext, data, label, why, reencoded in results:
                    k = pos // plan.per_shard
                    if shard is None or shard.k != k:
                        if shard is not None:
                            uploads.add(shard.path, shard.name, (manifest_key(shard.k), shard.close()))
                        shard = _Shard(staging, k)
                        summary.shards += 1
                    if why:
                        item = items[order[pos]][0]
                        shard.skipped.append((item if not target else f"item {item}", why))
                        continue
                    shard.add(f"{pos:09d}", ext, data, label)
                    shard.reencoded += reencoded
                    summary.samples += 1
                    summary.data_bytes += len(data)
            if shard is not None:
                uploads.add(shard.path, shard.name, (manifest_key(shard.k), shard.close()))
        finally:
            uploads.join()  # a run that fails keeps (and records) every shard it finished
    if part is not None:
        summary.seconds = time.monotonic() - start
        return summary
    merged = merge_parts(store)
    if not merged.samples:
        raise ConfigError(f"none of the {len(items)} files of {src} decodes; nothing written")
    merged.kept = summary.kept
    merged.seconds = time.monotonic() - start
    return merged


def merge_parts(dest) -> Summary:
    """Write the index of a run whose parts (``prepare(..., part=...)``) are all done: ``hetero prepare --merge``."""
    start = time.monotonic()
    store = open_store(dest, what="dest") if isinstance(dest, str) else dest
    summary = merge(store)
    summary.seconds = time.monotonic() - start
    return summary


def _claim(store, dest: str, plan: Plan, overwrite: bool) -> None:
    """Write ``plan`` to ``dest``, or check that the run already there has the same one."""
    names = [name for name, _ in store.list()]
    index = [name for name in names if name in (INDEX_NAME, JSON_INDEX_NAME)]
    shards = [name for name in names if name.endswith(".tar")]
    old = read_plan(store)
    if old == plan and not index:
        return  # another part of this run, or this part started again: keep what is finished
    if (old is not None or index or shards) and not overwrite:
        if old is not None and not index:
            raise ConfigError(f"{dest} holds an unfinished prepare run with other options or another source "
                              f"(its {PLAN}); pass the same SRC and options to go on with it, or --overwrite to "
                              "start again")
        found = index + shards
        raise ConfigError(f"{dest} already holds shards ({', '.join(found[:3])}{' ...' if len(found) > 3 else ''}); "
                          "pass --overwrite to replace them, or choose another destination")
    for name in index:  # the old index goes first, so the destination is never taken for complete meanwhile
        store.delete(name)
    for name in names:
        if name.startswith(WORK + "/"):
            store.delete(name)
    store.write_bytes(PLAN, plan.to_json())


def _sizes(items: list[tuple[str, int]], order: np.ndarray, target: str, options: dict) -> list[int]:
    """Bytes of up to 256 samples spread over the shuffled order (the same on every machine)."""
    picks = [int(order[p]) for p in np.linspace(0, len(items) - 1, min(256, len(items))).astype(int)]
    if not target:
        out = []
        for i in picks:
            with contextlib.suppress(OSError):
                out.append(os.path.getsize(items[i][0]))
        return out
    dataset = _load_dataset(target, options)
    out = []
    for i in picks[:32]:
        item = dataset[int(items[i][0])][0]
        out.append(int(item.numel()) // 2 if hasattr(item, "numel") else len(item))
    return out
