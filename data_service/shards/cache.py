"""A node-local, bounded cache of shuffle blocks, shared by every process of a data node.

A block's bytes (the stretch of each shard its samples occupy, back to back) are fetched once per
node into ``<dir>/<name>`` and read from there by every worker process: the first process to want a
block fetches it while the others wait for it (:class:`data_service.storage.filecache.FileCache` keeps the
files: locks, temporary file and rename, the bound). The operating system's page cache is the RAM
tier above the disk: a block read by one worker is in memory for the next.

The cache holds at most ``max_bytes``: before a block is added, the least recently used ones (by
modification time, which every use refreshes) are removed. A process that still has an evicted
file open keeps reading it (POSIX unlink semantics), so eviction never breaks a batch in flight.

``CacheReader`` is one process's side of a data set's entries (``ShardDataset``'s S3 blocks,
``ParquetDataset``'s decoded row groups): those it keeps open, those it fetches ahead of the
workers, and the threads that read a store's byte ranges in parallel.
"""
from __future__ import annotations

import collections
import logging
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, TypeVar

from ..errors import ConfigError, check_integer
from ..storage.base import Store
from ..storage.filecache import CacheError, FileCache

__all__ = ["BlockCache", "CacheError", "CacheReader", "check_reads", "default_dir"]

log = logging.getLogger(__name__)

OPEN_ENTRIES = 32  # entries a process keeps open (an interleaved epoch reads a few at a time)
T = TypeVar("T")


def default_dir() -> str:
    """``HETERO_CACHE_DIR``, else ``hetero-cache`` in the system's temporary folder (the container's disk)."""
    return os.environ.get("HETERO_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "hetero-cache")


class BlockCache:
    """Blocks as files under ``directory``, at most ``max_bytes`` together (0: 80 % of the free space).

    Args:
        directory: the cache folder (created); one per data set (the caller names it).
        max_bytes: the bound; 0 takes 80 % of the disk's free space when the cache opens.
        wait_s: the longest a process waits for another one's fetch of the same block.
    """

    def __init__(self, directory: str, max_bytes: int = 0, wait_s: float = 600.0) -> None:
        if max_bytes < 0:
            raise ConfigError(f"cache_bytes={max_bytes} must be >= 0 (0 = 80% of the free disk space)")
        try:
            self.files = FileCache(directory, max_bytes, evict=True, wait_s=wait_s)
        except OSError as exc:
            raise ConfigError(f"cache_dir={directory!r} cannot be created ({exc}); pass a writable folder "
                              "(pipeline.cache_dir or HETERO_CACHE_DIR)") from None
        self.dir = directory
        self.max_bytes = self.files.max_bytes = max_bytes or int(shutil.disk_usage(directory).free * 0.8)

    def open(self, name: str, size: int, fill: Callable[[int], None]) -> int:
        """A read-only descriptor of block ``name`` (``size`` bytes), fetched by ``fill(fd)`` if absent.

        ``fill`` writes the block into the descriptor it is given (``os.pwrite``); it runs in one
        process of the node at a time, and never for a block already here.

        Raises:
            ConfigError: the block is larger than the whole cache.
            CacheError: another process held the block's lock past ``wait_s``, or the fetch
                brought another size.
        """
        if size > self.max_bytes:
            raise ConfigError(f"a shuffle block of {size} bytes does not fit cache_bytes={self.max_bytes}; raise "
                              "cache_bytes or lower shuffle_block")
        return self.files.fetch(name, size, fill)

    def drop(self, name: str) -> None:
        """Remove block ``name`` from the cache (its bytes failed a checksum): the next use fetches it again."""
        self.files.discard(name)

    def made(self, name: str, make: Callable[[], list[bytes]], what: str = "a block") -> int:
        """A read-only descriptor of entry ``name``, made by ``make()`` (its bytes, in pieces) if absent:
        for entries whose size is known only once made. ``make`` runs in one process of the node at a
        time, and never for an entry already here.

        Raises:
            ConfigError: the entry is larger than the whole cache.
            CacheError: another process held the entry's lock past the wait.
        """
        def stored() -> int:
            chunks = make()
            size = sum(len(c) for c in chunks)
            if size > self.max_bytes or not self.files.put(name, chunks) or (fd := self.files.open(name)) is None:
                raise ConfigError(f"{what} of {size} bytes does not fit cache_bytes={self.max_bytes} "
                                  f"({self.dir}); raise cache_bytes or free disk space there")
            return fd

        return self.files.once(name, "making", stored)

    def made_bytes(self, name: str, make: Callable[[], list[bytes]], what: str) -> bytes:
        """Entry ``name``'s bytes, made by ``make()`` if absent (as :meth:`made`)."""
        fd = self.made(name, make, what)
        try:
            return os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)


def check_reads(block_samples: int, range_bytes: int, readers: int) -> None:
    """Refuse read options no data set can use (a ConfigError naming the option), at start."""
    check_integer("block_samples", block_samples, 1)
    check_integer("readers", readers, 1)
    if range_bytes < 1 << 16:
        raise ConfigError(f"range_bytes={range_bytes} must be at least 64 KiB")


class CacheReader:
    """One process's reads of a data set's entries in the node's ``cache`` (entry ``k`` is the file
    ``name(k)``) and of their bytes in ``store``: ``readers`` ranges at once, each at most
    ``range_bytes``. ``what`` an entry is names it in log lines, and its first word the threads."""

    def __init__(self, cache: BlockCache, name: Callable[[int], str], store: Store, readers: int, range_bytes: int,
                 what: str) -> None:
        self.cache, self.name, self.store, self.what = cache, name, store, what
        self.readers, self.range_bytes = readers, range_bytes
        self._open: collections.OrderedDict[int, tuple[Any, ...]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._threads: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._prefetcher: ThreadPoolExecutor | None = None
        self._prefetching: set[int] = set()

    def entry(self, k: int, open_: Callable[[int], tuple[Any, ...]]) -> tuple[Any, ...]:
        """Entry ``k`` as ``open_(k)`` opened it (a descriptor first, then what the caller read of it),
        kept open while it is among the last ``OPEN_ENTRIES`` used."""
        hit = self._open.get(k)
        if hit is not None:
            self._open.move_to_end(k)
            return hit
        held = self._open[k] = open_(k)
        while len(self._open) > OPEN_ENTRIES:
            os.close(self._open.popitem(last=False)[1][0])
        return held

    def drop(self, k: int) -> None:
        """Forget entry ``k`` (its bytes failed a check): close it here, remove it from the node's cache."""
        held = self._open.pop(k, None)
        if held is not None:
            os.close(held[0])
        self.cache.drop(self.name(k))

    def prefetch(self, keys: Iterable[int], fetch: Callable[[int], None]) -> None:
        """Run ``fetch(k)`` on a thread of the reader's for each entry of ``keys`` neither cached nor being
        fetched; returns at once. A failure is logged: the worker that needs the entry fetches it again
        and reports the error."""
        with self._lock:
            todo = [k for k in keys if k not in self._prefetching and not self.cache.files.cached(self.name(k))]
            if not todo:
                return
            self._prefetching.update(todo)
            if self._prefetcher is None:
                self._prefetcher = ThreadPoolExecutor(2, thread_name_prefix=f"{self.what.split()[0]}-prefetch")
            prefetcher = self._prefetcher
        for k in todo:
            prefetcher.submit(self._prefetch_one, k, fetch)

    def _prefetch_one(self, k: int, fetch: Callable[[int], None]) -> None:
        try:
            fetch(k)
        except Exception as exc:
            log.warning("prefetch of %s %d failed: %s", self.what, k, exc)
        finally:
            with self._lock:
                self._prefetching.discard(k)  # evicted later: a later request fetches it again

    def read(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``name``: one read, or ranges of ``range_bytes`` read in parallel."""
        return b"".join(self._map(lambda r: self.store.read(name, *r), self._ranges(start, stop)))

    def fill(self, out: int, parts: list[tuple[str, int, int]]) -> None:
        """Write ``parts`` (object name, start, stop) into descriptor ``out`` back to back, read in
        ranges of ``range_bytes``, ``readers`` at once."""
        jobs, pos = [], 0
        for name, start, stop in parts:
            jobs += [(name, a, b, pos + a - start) for a, b in self._ranges(start, stop)]
            pos += stop - start
        os.ftruncate(out, pos)
        self._map(lambda job: os.pwrite(out, self.store.read(*job[:3]), job[3]), jobs)

    def _ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        return [(a, min(stop, a + self.range_bytes)) for a in range(start, stop, self.range_bytes)]

    def _map(self, fn: Callable[[Any], T], jobs: list) -> list[T]:
        """``fn`` of each job: on this thread for one, else on the reader's threads (made again in a
        forked process, where a pool made before the fork has none)."""
        if len(jobs) == 1:
            return [fn(jobs[0])]
        with self._lock:
            if self._threads is None or self._pid != os.getpid():
                self._threads = ThreadPoolExecutor(self.readers, thread_name_prefix=f"{self.what.split()[0]}-read")
                self._pid = os.getpid()
            threads = self._threads
        return list(threads.map(fn, jobs))
