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
import multiprocessing as mp
import os
import time
from typing import Iterator

import numpy as np

from ..errors import ConfigError, check_integer
from ..shards.format import INDEX_NAME, JSON_INDEX_NAME
from ..storage import open_store
from .plan import PLAN, WORK, Split, Summary, finished, items_digest, merge, parse_part, per_shard, read_plan
from .shard_files import write_shards

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
        # not a known signature (yet it decodes, when verified): keep the bytes, name it as most are
        ext = next((e for magic, e in MAGIC if data.startswith(magic)), "jpg")
        image = decode_bytes(data, path) if (verify or max_side) else None
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
def _sources(src: str, options: dict) -> tuple[list[str], list[tuple[str, int]], str]:
    """(classes, [(path or item number, label)], import target) of SRC."""
    if ":" in src and not os.path.exists(src) and "/" not in src.split(":")[0]:
        dataset = _load_dataset(src, options)
        return [str(c) for c in getattr(dataset, "classes", [])], [(str(i), 0) for i in range(len(dataset))], src
    from ..pipelines.images import scan

    classes, samples = scan(src)
    return classes, samples, ""


def _converted(jobs: list, target: str, options: dict, workers: int, progress: bool):
    """``_convert``'s results for ``jobs``, in order, from ``workers`` processes (one: this one)."""
    if not jobs:  # every shard of this part is finished
        return
    with contextlib.ExitStack() as stack:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = stack.enter_context(tqdm(total=len(jobs), unit="img", desc="prepare", mininterval=0.5))
        results: Iterator[tuple[int, str, bytes, int, str, bool]]
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
    workers = _check_options(shard_size, max_side, workers)
    if isinstance(part, str):
        part = parse_part(part)
    options = dict(options or {})
    store = open_store(dest, what="dest", create=True)
    classes, items, target = _sources(src, options)
    if not items:
        raise ConfigError(f"{src} holds no samples")
    order = _order(len(items), shuffle_seed)
    plan = _plan(src, classes, items, order, target, options, shard_size, shuffle_seed, max_side, verify)
    _claim(store, dest, plan, overwrite)
    done = finished(store)
    todo = [k for k in plan.part_shards(part) if k not in done]
    summary = Summary(part=f"{part[0]}/{part[1]}" if part else "", kept=len(plan.part_shards(part)) - len(todo))
    jobs = _jobs(plan, todo, items, order, max_side, verify)
    # a skipped sample is listed by its file, or by its number in an import-path data set
    write_shards(store, plan.per_shard, _converted(jobs, target, options, workers, progress), summary,
                 lambda pos: f"item {items[order[pos]][0]}" if target else items[order[pos]][0])
    if part is not None:
        summary.seconds = time.monotonic() - start
        return summary
    merged = merge_parts(store)
    if not merged.samples:
        raise ConfigError(f"none of the {len(items)} files of {src} decodes; nothing written")
    merged.kept = summary.kept
    merged.seconds = time.monotonic() - start
    return merged


def _check_options(shard_size: int, max_side: int, workers: int) -> int:
    """Check ``prepare``'s sizes and worker count; the worker processes to use (0 given: every core)."""
    if shard_size < 1_000_000:
        raise ConfigError(f"shard_size={shard_size} bytes is below 1 MB: shards that small cost one request "
                          "each; use 64MB to 1GB")
    check_integer("max_side", max_side, 0, hint=" (0 = keep every image as it is)")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ConfigError(f"workers={workers} must be >= 1")
    return workers


def _order(samples: int, shuffle_seed: int | None) -> np.ndarray:
    """The order samples are written in: a permutation seeded by ``shuffle_seed`` (None: the source's)."""
    if shuffle_seed is None:
        return np.arange(samples)
    return np.random.Generator(np.random.PCG64(shuffle_seed)).permutation(samples)


def _plan(src: str, classes: list[str], items: list[tuple[str, int]], order: np.ndarray, target: str,
          options: dict, shard_size: int, shuffle_seed: int | None, max_side: int, verify: bool) -> Split:
    """The run's plan: samples per shard from the source's sizes, and what identifies the source."""
    source = (items_digest(items, src) if not target
              else f"{target}:{len(items)}:{json.dumps(options, sort_keys=True)}")
    return Split(len(items), per_shard(shard_size, _sizes(items, order, target, options)), shuffle_seed, max_side,
                verify, tuple(classes), source)


def _jobs(plan: Split, shards, items: list[tuple[str, int]], order: np.ndarray, max_side: int,
          verify: bool) -> list[tuple[int, str, int, int, bool]]:
    """``_convert``'s work for ``shards``: (position, path or item number, label, max_side, verify) per sample."""
    return [(pos, items[order[pos]][0], items[order[pos]][1], max_side, verify)
            for k in shards for pos in range(k * plan.per_shard, min(plan.samples, (k + 1) * plan.per_shard))]


def merge_parts(dest) -> Summary:
    """Write the index of a run whose parts (``prepare(..., part=...)``) are all done: ``hetero prepare --merge``."""
    start = time.monotonic()
    store = open_store(dest, what="dest") if isinstance(dest, str) else dest
    summary = merge(store)
    summary.seconds = time.monotonic() - start
    return summary


def _claim(store, dest: str, plan: Split, overwrite: bool) -> None:
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
    samples = (dataset[int(items[i][0])][0] for i in picks[:32])
    return [int(item.numel()) // 2 if hasattr(item, "numel") else len(item) for item in samples]
