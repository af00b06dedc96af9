"""``ParquetDataset``: a Parquet data set read in place (a file, or a folder or ``s3://`` prefix of them).

The layout Hugging Face ``datasets`` exports (and anything pyarrow writes): a column of image
bytes (``binary``, or a struct with a ``bytes`` field such as ``datasets.Image``'s ``{bytes,
path}``) and a column of integer labels. Samples are the rows, file after file in name order, each
file's row groups in order. Class names come from the ``datasets`` metadata of the label column
(its ``ClassLabel`` names) when it is there, else ``0..max`` from the row groups' statistics.

Sample ``i`` is ``(bytes, label)`` as from :class:`~.dataset.ShardDataset`, and like it a
``ParquetDataset`` is a :class:`~data_service.contract.pipeline.BlockPrefetcher`. The unit read is a row
group: the byte ranges of its two column chunks (nothing else of the file), read once per node,
decoded by pyarrow and kept in the node's cache (:class:`~.cache.BlockCache`, one file per row
group: :func:`.parquet_meta.entry`) where every worker process of the node reads single samples.
Opening reads each file's footer once per node (also kept in the cache) and makes the table of row
groups once per node; every other process of the node LISTs the location and loads that table:
what it holds grows with the number of row groups, never with the number of rows.

A shuffle block (``block_samples`` rows) touches the row groups holding its rows: pick
``shuffle_block`` as a multiple of the row group size so that blocks and row groups line up and
no two data nodes read the same row group (a row group two blocks share is read by each node
serving one of them, once per node).

A missing column, or one of another type, is a ConfigError at start naming the file and the
columns there (:mod:`.parquet_meta`). A row group whose columns do not decode is a
:class:`ParquetReadError` naming the file and rows, or with ``on_corrupt="skip"`` each of its rows
is skipped (:class:`~data_service.SkipSample`, counted in the data server's ``samples_skipped``);
so is a row without a label. The failure is kept in the cache like a decoded row group: the bytes
are read once either way.

Page CRCs (pyarrow's ``write_page_checksum=True``) are verified as pages decode: a mismatch reads
the row group once more from the source before it counts as not decoding. A decoded row's CRC32C
(image bytes and label) is checked on every read from the cache: a bad cached copy is dropped and
decoded again. Both re-reads count in the data server's ``samples_reread``.
"""
from __future__ import annotations

import collections
import hashlib
import io
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..contract.pipeline import count_reread
from ..errors import ConfigError, DataServiceError
from ..storage import open_store
from . import parquet_meta as pm
from .cache import BlockCache, default_dir

log = logging.getLogger(__name__)

OPEN_BLOCKS = 32  # decoded row groups a process keeps open


class ParquetReadError(DataServiceError):
    """A row group's columns do not decode (a corrupt or truncated file)."""


class ParquetDataset:
    """Map-style: sample ``i`` is ``(image bytes, int label)``, from Parquet files read in place.

    Args:
        location: a ``.parquet`` file, or a folder or ``s3://bucket/prefix`` of them (subfolders included).
        block_samples: rows per shuffle block (the pipeline's ``shuffle_block``).
        image_column, label_column: the columns read.
        on_corrupt: ``"fail"`` or ``"skip"`` for a row group that does not decode, or a row without a label.
        cache_dir, cache_bytes, request_timeout_s: as :class:`~.dataset.ShardDataset`.
        readers: parallel ranged reads: footers when opening, ranges of a large row group.
        range_bytes: the most one read asks for; a larger row group is read in ranges of this size.

    Raises:
        ConfigError: no Parquet files, a missing or mistyped column, a file that is not Parquet.
    """

    def __init__(self, location: str, *, block_samples: int = 1024, image_column: str = "image",
                 label_column: str = "label", on_corrupt: str = "fail", cache_dir: str = "", cache_bytes: int = 0,
                 request_timeout_s: float = 60.0, readers: int = 8, range_bytes: int = 16 << 20) -> None:
        if isinstance(block_samples, bool) or not isinstance(block_samples, int) or block_samples < 1:
            raise ConfigError(f"block_samples={block_samples!r} must be an integer >= 1")
        if on_corrupt not in ("fail", "skip"):
            raise ConfigError(f"on_corrupt={on_corrupt!r} must be 'fail' or 'skip'")
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise ConfigError("pipeline.parquet needs pyarrow on the data nodes: pip install "
                              "'hetero-data-service[parquet]'") from None
        if isinstance(readers, bool) or not isinstance(readers, int) or readers < 1:
            raise ConfigError(f"readers={readers!r} must be an integer >= 1")
        if range_bytes < 1 << 16:
            raise ConfigError(f"range_bytes={range_bytes} must be at least 64 KiB")
        self.location, self.block_samples, self.on_corrupt = location, block_samples, on_corrupt
        self.readers, self.range_bytes = readers, range_bytes
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self.image_column, self.label_column = image_column, label_column
        single = location.endswith(".parquet")
        prefix, _, base = location.rstrip("/").rpartition("/") if single else (location, "", "")
        self.store = open_store(prefix or ".", what="parquet", request_timeout_s=request_timeout_s)
        if single:
            listed = [(base, self.store.check(base), pm.version(self.store, base))]
        else:
            from .wds_index import list_objects

            listed = list_objects(self.store, ".parquet", versions=True)
        self.files = [(name, size) for name, size, _ in listed]
        # the cache is keyed by what was listed: a file written again is read again
        listing = json.dumps([location, listed, image_column, label_column]).encode()
        self.cache = BlockCache(os.path.join(cache_dir or default_dir(),
                                             f"parquet-{hashlib.sha256(listing).hexdigest()[:16]}"), cache_bytes)
        self._lock = threading.Lock()
        self.rereads = 0  # row groups read again from the source after a page CRC or cached-row CRC mismatch
        self._open: collections.OrderedDict[int, tuple] = collections.OrderedDict()
        self._prefetcher: ThreadPoolExecutor | None = None
        self._prefetched: set[int] = set()
        self._meta: collections.OrderedDict[int, object] = collections.OrderedDict()
        fd = self.cache.made("row-groups.npz", lambda: [self._table(readers)], "the row group table")
        try:
            table = np.load(io.BytesIO(os.pread(fd, os.fstat(fd).st_size, 0)))
        finally:
            os.close(fd)
        self.first, self.group_file, self.group_index, self.spans = (
            table[k] for k in ("first", "group_file", "group_index", "spans"))
        self.classes = [str(c) for c in json.loads(bytes(table["classes"]))]

    def _table(self, readers: int) -> bytes:
        """The row groups of every file as columns (first row, file, index in the file, byte span) and
        the classes: made once per node from the footers, then loaded by every process."""
        with ThreadPoolExecutor(readers, thread_name_prefix="parquet-footer") as pool:
            metas = list(pool.map(self._metadata, range(len(self.files))))
        return pm.group_table(metas, self.image_column, self.label_column, [self._url(k) for k in range(len(metas))],
                              self.location)

    def _metadata(self, k: int):
        """File ``k``'s footer, read once per node into the cache, parsed (the last few kept per process)."""
        meta = self._meta.get(k)
        if meta is not None:
            return meta
        name, size = self.files[k]
        fd = self.cache.made(f"footer-{k:06d}", lambda: [pm.read_footer(self.store, name, size, self._url(k))],
                             "a Parquet footer")
        try:
            meta = pm.parse_footer(os.pread(fd, os.fstat(fd).st_size, 0), self._url(k))
        finally:
            os.close(fd)
        with self._lock:
            self._meta[k] = meta
            while len(self._meta) > 4:
                self._meta.popitem(last=False)
        return meta

    # -- samples
    def __len__(self) -> int:
        return int(self.first[-1])

    def group_of(self, i: int) -> int:
        """The row group holding sample ``i``."""
        return int(np.searchsorted(self.first, i, side="right")) - 1

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} is outside 0..{len(self) - 1}")
        g = self.group_of(i)
        failed = self._group(g)[3]
        row = i - int(self.first[g])
        if not failed:
            data, label = self._checked(i, g, row)
            if label >= 0:
                return data, label
            failed = f"{self._where(g)}: row {row} has no label"
        if self.on_corrupt == "skip":
            from ..contract.pipeline import SkipSample

            raise SkipSample(f"sample {i}: {failed}", where=self.where(i))
        raise ParquetReadError(f"{failed}; replace the file, or pass pipeline.on_corrupt=skip to drop such rows "
                               "(counted in the data server's samples_skipped)")

    def _checked(self, i: int, g: int, row: int) -> tuple[bytes, int]:
        """Row ``row`` of row group ``g`` (sample ``i``), its CRC32C checked; a bad cached copy decoded again."""
        data, label = pm.read_row(*self._opened(g), row)
        if data is None:
            # the cached row group failed its check: a bad copy, dropped and decoded again from the source
            self.rereads += 1
            count_reread()
            log.warning("sample %d (%s): the cached row fails its CRC32C; decoding the row group again", i,
                        self._where(g))
            self._drop(g)
            data, label = pm.read_row(*self._opened(g), row)
            if data is None:
                raise ParquetReadError(f"sample {i} ({self._where(g)}, row {row}): its cached copy fails its "
                                       f"CRC32C twice; check the disk of the node's cache ({self.cache.dir})")
        return data, label

    def _opened(self, g: int) -> tuple:
        fd, offsets, labels, failed, crcs = self._group(g)
        if failed:  # decoded again, the row group no longer decodes: the source changed
            raise ParquetReadError(f"{failed}; replace the file")
        return fd, offsets, labels, crcs

    def _drop(self, g: int) -> None:
        held = self._open.pop(g, None)
        if held is not None:
            os.close(held[0])
        self.cache.drop(f"rg-{g:08d}.blk")

    def _group(self, g: int) -> tuple:
        """(descriptor, offsets, labels, failure message, row CRCs) of decoded row group ``g``, kept open."""
        hit = self._open.get(g)
        if hit is not None:
            self._open.move_to_end(g)
            return hit
        for attempt in range(2):
            fd = self._decoded(g)
            parsed = pm.open_entry(fd, int(self.first[g + 1] - self.first[g]))
            if parsed is not None:
                entry = (fd, *parsed)
                break
            os.close(fd)  # a damaged head (or an older release's entry): decoded again from the source
            self.cache.drop(f"rg-{g:08d}.blk")
            if attempt:
                raise ParquetReadError(f"{self._where(g)}: its decoded copy in {self.cache.dir} is damaged twice; "
                                       "check the disk of the node's cache")
            self.rereads += 1
            count_reread()
        self._open[g] = entry
        while len(self._open) > OPEN_BLOCKS:
            os.close(self._open.popitem(last=False)[1][0])
        return entry

    def _decoded(self, g: int) -> int:
        return self.cache.made(f"rg-{g:08d}.blk", lambda: self._decode(g), "a decoded row group")

    def _decode(self, g: int) -> list[bytes]:
        """Row group ``g`` read (the span of its two column chunks, once) and decoded into a cache entry."""
        import pyarrow.parquet as pq

        k, index = int(self.group_file[g]), int(self.group_index[g])
        name, size = self.files[k]
        start, stop = (int(x) for x in self.spans[g])
        meta = self._metadata(k)
        paths = pm.columns(meta.schema.to_arrow_schema(), self.image_column, self.label_column, self._url(k))
        try:
            for attempt in range(2):
                raw = self._read(name, start, stop)  # a store error propagates: retried later, never cached
                try:
                    table = pq.ParquetFile(pm.Window(size, start, raw), metadata=meta,
                                           page_checksum_verification=True).read_row_group(
                        index, columns=list(paths), use_threads=False)
                    break
                except OSError as exc:
                    if pm.PAGE_CRC not in str(exc) or attempt:
                        raise
                    # a page CRC mismatch may be the transfer's: the source is read once more
                    self.rereads += 1
                    count_reread()
                    log.warning("%s: a page fails its CRC (%s); reading the row group again", self._where(g), exc)
            return pm.entry(table)
        except Exception as exc:  # pyarrow's errors for bytes that do not decode
            reason = " ".join(str(exc).split()) or type(exc).__name__
            if pm.PAGE_CRC in reason:
                reason = f"a page fails its CRC, read twice from the source: the file was damaged after it was " \
                         f"written ({reason})"
            message = f"{self._where(g)}: column {self.image_column!r} or {self.label_column!r} cannot be read " \
                      f"({reason})"
            return pm.failed_entry(message)

    def _read(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``name``: one read, or ranges of ``range_bytes`` read in parallel."""
        if stop - start <= self.range_bytes:
            return self.store.read(name, start, stop)
        with self._lock:
            if self._pool is None or self._pid != os.getpid():  # a pool made before a fork has no threads
                self._pool, self._pid = ThreadPoolExecutor(self.readers, thread_name_prefix="parquet-read"), os.getpid()
        ranges = [(a, min(stop, a + self.range_bytes)) for a in range(start, stop, self.range_bytes)]
        return b"".join(self._pool.map(lambda r: self.store.read(name, *r), ranges))

    # -- blocks
    def block_groups(self, block: int) -> range:
        """The row groups holding block ``block``'s rows."""
        first = block * self.block_samples
        last = min(first + self.block_samples, len(self)) - 1
        return range(self.group_of(first), self.group_of(last) + 1)

    def prefetch_block(self, block: int) -> None:
        """Start reading block ``block``'s row groups into the node's cache; returns at once (a
        :class:`~data_service.contract.pipeline.BlockPrefetcher`)."""
        with self._lock:
            todo = [g for g in self.block_groups(block)
                    if g not in self._prefetched and not self.cache.cached(f"rg-{g:08d}.blk")]
            self._prefetched.update(todo)
            if todo and self._prefetcher is None:
                self._prefetcher = ThreadPoolExecutor(2, thread_name_prefix="parquet-prefetch")
        for g in todo:
            self._prefetcher.submit(self._prefetch_one, g)

    def _prefetch_one(self, g: int) -> None:
        try:
            os.close(self._decoded(g))
        except Exception as exc:  # the worker that needs the row group reads it again and reports the error
            log.warning("prefetch of row group %d of %s failed: %s", g, self.location, exc)
        finally:
            with self._lock:
                self._prefetched.discard(g)

    def _url(self, k: int) -> str:
        return f"{self.store.url.rstrip('/')}/{self.files[k][0]}"

    def where(self, i: int) -> str:
        """The file holding sample ``i`` (for messages)."""
        return self._url(int(self.group_file[self.group_of(i)]))

    def _where(self, g: int) -> str:
        return (f"{self._url(int(self.group_file[g]))} row group {int(self.group_index[g])} "
                f"(samples {int(self.first[g])}..{int(self.first[g + 1]) - 1})")

