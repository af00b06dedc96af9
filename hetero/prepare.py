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
import logging
import multiprocessing as mp
import os
import tarfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from data_service.errors import ConfigError
from data_service.shards.format import INDEX_NAME, JSON_INDEX_NAME, SHARD_PATTERN, ShardIndex, ShardInfo, padded
from data_service.shards.indexfile import write_index
from data_service.storage import open_store

log = logging.getLogger(__name__)

MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF8", "gif"), (b"RIFF", "webp"))


@dataclass
class Summary:
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    data_bytes: int = 0
    reencoded: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def lines(self, dest: str) -> list[str]:
        out = [f"wrote {self.samples} samples in {self.shards} shard(s), {self.bytes / 1e6:.1f} MB "
               f"({self.data_bytes / 1e6:.1f} MB of sample data) to {dest} in {self.seconds:.1f}s"]
        if self.reencoded:
            out.append(f"re-encoded {self.reencoded} image(s) larger than max_side")
        if self.skipped:
            out.append(f"skipped {len(self.skipped)} file(s) that do not decode:")
            out += [f"  {name}: {why}" for name, why in self.skipped[:50]]
            if len(self.skipped) > 50:
                out.append(f"  ... and {len(self.skipped) - 50} more")
        return out


# -- the per-file work, in worker processes
_SOURCE = None  # the import-path data set of this worker process, when the source is one


def _init_worker(target: str, options: dict) -> None:
    global _SOURCE
    import torch

    torch.set_num_threads(1)
    _SOURCE = _load_dataset(target, options) if target else None  # None: files of a folder


def _load_dataset(target: str, options: dict):
    from data_service.pipeline import PipelineSpec

    dataset = PipelineSpec(target, options).resolve()(**options)
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise ConfigError(f"{target} returned {type(dataset).__name__}, not a map-style data set "
                          "(__len__ and __getitem__ giving (image bytes or uint8 [C, H, W] tensor, label))")
    return dataset


def _convert(job: tuple[int, str, int, int, bool]) -> tuple[int, str, bytes, int, str, bool]:
    """(position, member extension, bytes, label, why skipped, re-encoded) for one item."""
    import torch

    from data_service.pipelines.images import CorruptImageError, decode_bytes

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
class _ShardWriter:
    """Writes members into numbered tar files of about ``shard_size`` bytes; records where each sample lies."""

    def __init__(self, folder: str, shard_size: int, on_shard) -> None:
        self.folder, self.shard_size, self.on_shard = folder, shard_size, on_shard
        self.shards: list[ShardInfo] = []
        self.offsets, self.lengths, self.labels = [], [], []
        self._tar: tarfile.TarFile | None = None
        self._name = ""
        self._first = 0

    def add(self, key: str, ext: str, data: bytes, label: int) -> None:
        cls = str(label).encode()
        need = 2 * 512 + padded(len(data)) + padded(len(cls))
        if self._tar is not None and self._tar.offset + need > self.shard_size and self._count():
            self._close()
        if self._tar is None:
            self._name = SHARD_PATTERN.format(len(self.shards))
            self._tar = tarfile.open(os.path.join(self.folder, self._name), "w", format=tarfile.USTAR_FORMAT)
            self._first = len(self.offsets)
        self._member(f"{key}.{ext}", data)
        self.offsets.append(self._tar.offset - padded(len(data)))
        self.lengths.append(len(data))
        self.labels.append(label)
        self._member(f"{key}.cls", cls)

    def _member(self, name: str, data: bytes) -> None:
        import io

        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o444, "", ""
        self._tar.addfile(info, io.BytesIO(data))

    def _count(self) -> int:
        return len(self.offsets) - self._first

    def _close(self) -> None:
        self._tar.close()
        path = os.path.join(self.folder, self._name)
        self.shards.append(ShardInfo(self._name, os.path.getsize(path), self._first, self._count()))
        self._tar = None
        self.on_shard(path, self._name)

    def finish(self) -> None:
        if self._tar is not None:
            self._close()


def _sources(src: str, options: dict) -> tuple[list[str], list[tuple[str, int]], str]:
    """(classes, [(path or item number, label)], import target) of SRC."""
    if ":" in src and not os.path.exists(src) and "/" not in src.split(":")[0]:
        dataset = _load_dataset(src, options)
        classes = [str(c) for c in getattr(dataset, "classes", [])]
        return classes, [(str(i), 0) for i in range(len(dataset))], src
    from data_service.pipelines.images import scan

    classes, samples = scan(src)
    return classes, samples, ""


class _Uploads:
    """Stores each finished shard under its name (a folder renames it into place, S3 uploads it),
    at most four at once so local staging stays bounded."""

    def __init__(self, store) -> None:
        self.store = store
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def add(self, path: str, name: str) -> None:
        def upload():
            try:
                self.store.write_file(name, path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
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
            options: dict | None = None) -> Summary:
    """Write ``src`` (an image folder, or ``pkg.mod:fn`` returning a map-style data set) as shards in ``dest``.

    Args:
        shard_size: bytes per tar file, about (a file larger than this gets a shard of its own).
        max_side: re-encode images whose long side exceeds this many pixels (0: keep every file as is).
        workers: processes that read and check files (0: every core).
        shuffle_seed: the order samples are written in is a permutation seeded by this (None: in
            the source's order, classes one after another).
        overwrite: replace shards already at ``dest`` (without it, existing shards are an error).
        verify: decode every image once and skip those that do not decode.
        options: keyword options of an import-path source.

    Raises:
        ConfigError: bad options, an empty source, or ``dest`` already holding shards.
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
    options = dict(options or {})
    store = open_store(dest, what="dest", create=True)
    existing = [name for name, _ in store.list() if name in (INDEX_NAME, JSON_INDEX_NAME) or name.endswith(".tar")]
    if existing and not overwrite:
        raise ConfigError(f"{dest} already holds shards ({', '.join(existing[:3])}{' ...' if len(existing) > 3 else ''}); "
                          "pass --overwrite to replace them, or choose another destination")
    classes, items, target = _sources(src, options)
    if not items:
        raise ConfigError(f"{src} holds no samples")
    order = np.arange(len(items)) if shuffle_seed is None else \
        np.random.Generator(np.random.PCG64(shuffle_seed)).permutation(len(items))
    summary = Summary()
    if existing:  # the old index goes first, so the destination is never taken for complete meanwhile
        for name in (INDEX_NAME, JSON_INDEX_NAME):
            if name in existing:
                store.delete(name)
    jobs = [(pos, items[i][0], items[i][1], max_side, verify) for pos, i in enumerate(order)]
    with store.staging() as staging:
        uploads = _Uploads(store)
        writer = _ShardWriter(staging, shard_size, uploads.add)
        with contextlib.closing(_converted(jobs, target, options, workers, progress)) as results:
            for pos, ext, data, label, why, reencoded in results:
                if why:
                    summary.skipped.append((items[order[pos]][0] if not target else f"item {items[order[pos]][0]}",
                                            why))
                    continue
                writer.add(f"{len(writer.offsets):09d}", ext, data, label)
                summary.reencoded += reencoded
        writer.finish()
        uploads.join()
    if not writer.offsets:
        raise ConfigError(f"none of the {len(items)} files of {src} decodes; nothing written")
    index = ShardIndex(classes, writer.shards, np.array(writer.offsets), np.array(writer.lengths),
                       np.array(writer.labels))
    write_index(store, index)
    keep = {s.name for s in writer.shards} | {INDEX_NAME}
    for name in existing:  # old shards the new ones did not replace
        if name not in keep:
            store.delete(name)
    summary.samples, summary.shards = len(index), len(writer.shards)
    summary.bytes, summary.data_bytes = sum(s.size for s in writer.shards), index.data_bytes
    summary.seconds = time.monotonic() - start
    return summary
