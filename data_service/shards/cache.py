"""A node-local, bounded cache of shuffle blocks, shared by every process of a data node.

A block's bytes (the stretch of each shard its samples occupy, back to back) are fetched once per
node into ``<dir>/<name>`` and read from there by every worker process: the first process to want a
block fetches it while the others wait for it (:class:`data_service.storage.filecache.FileCache` keeps the
files: locks, temporary file and rename, the bound). The operating system's page cache is the RAM
tier above the disk: a block read by one worker is in memory for the next.

The cache holds at most ``max_bytes``: before a block is added, the least recently used ones (by
modification time, which every use refreshes) are removed. A process that still has an evicted
file open keeps reading it (POSIX unlink semantics), so eviction never breaks a batch in flight.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from typing import Callable

from ..errors import ConfigError
from ..storage.filecache import CacheError, FileCache, flock

__all__ = ["BlockCache", "CacheError", "default_dir"]


def default_dir() -> str:
    """``HETERO_CACHE_DIR``, else ``hetero-cache`` in the system's temporary folder (the container's disk)."""
    import tempfile

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

    def path(self, name: str) -> str:
        return self.files.path(name)

    def cached(self, name: str) -> bool:
        return self.files.cached(name)

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
        fd = self.files.open(name)
        if fd is not None:
            return fd
        lock = os.open(self.files.path(name) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            flock(lock, fcntl.LOCK_EX, self.files.wait_s,
                  lambda: f"{name}: another process of this host has been making it for over "
                          f"{self.files.wait_s:.0f}s (cache {self.dir})")
            fd = self.files.open(name)
            if fd is None:
                chunks = make()
                size = sum(len(c) for c in chunks)
                if size > self.max_bytes or not self.files.put(name, chunks) or (fd := self.files.open(name)) is None:
                    raise ConfigError(f"{what} of {size} bytes does not fit cache_bytes={self.max_bytes} "
                                      f"({self.dir}); raise cache_bytes or free disk space there")
            return fd
        finally:
            os.close(lock)
