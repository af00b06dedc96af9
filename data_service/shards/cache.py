"""A node-local, bounded cache of shuffle blocks, shared by every process of a data node.

A block's bytes (the stretch of each shard its samples occupy, back to back) are fetched once per
node into ``<dir>/<name>`` and read from there by every worker process. The first process to want a
block takes an exclusive ``flock`` on ``<name>.lock``, fetches into a temporary file and renames it
into place; the others wait on the lock (with a deadline), then find the file. The operating
system's page cache is the RAM tier above the disk: a block read by one worker is in memory for
the next.

The cache holds at most ``max_bytes``: before a block is added, the least recently used files
(by modification time, which every use refreshes) are removed. A process that still has an evicted
file open keeps reading it (POSIX unlink semantics), so eviction never breaks a batch in flight.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import time
from typing import Callable

from ..errors import ConfigError, DataServiceError

log = logging.getLogger(__name__)

LOCK_POLL_S = 0.01


class CacheError(DataServiceError):
    """A block could not be cached (its fetch failed, or another process held it past the deadline)."""


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
        self.dir = directory
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cache_dir={directory!r} cannot be created ({exc}); pass a writable folder "
                              "(pipeline.cache_dir or HETERO_CACHE_DIR)") from None
        if max_bytes < 0:
            raise ConfigError(f"cache_bytes={max_bytes} must be >= 0 (0 = 80% of the free disk space)")
        self.max_bytes = max_bytes or int(shutil.disk_usage(directory).free * 0.8)
        self.wait_s = wait_s
        self.hits = 0
        self.fills = 0

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def cached(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def open(self, name: str, size: int, fill: Callable[[int], None]) -> int:
        """A read-only descriptor of block ``name`` (``size`` bytes), fetched by ``fill(fd)`` if absent.

        ``fill`` writes the block into the descriptor it is given (``os.pwrite``); it runs in one
        process of the node at a time, and never for a block already here.

        Raises:
            ConfigError: the block is larger than the whole cache.
            CacheError: another process held the block's lock past ``wait_s``.
        """
        if size > self.max_bytes:
            raise ConfigError(f"a shuffle block of {size} bytes does not fit cache_bytes={self.max_bytes}; raise "
                              "cache_bytes or lower shuffle_block")
        path = self.path(name)
        fd = self._open_existing(path)
        if fd is not None:
            self.hits += 1
            return fd
        lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._lock(lock, name)
            fd = self._open_existing(path)  # another process fetched it while this one waited
            if fd is not None:
                self.hits += 1
                return fd
            self._make_room(size, keep=name)
            tmp = f"{path}.{os.getpid()}.part"
            out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                fill(out)
                if os.fstat(out).st_size != size:
                    raise CacheError(f"block {name}: fetched {os.fstat(out).st_size} bytes, expected {size}")
                os.rename(tmp, path)
            except BaseException:
                os.close(out)
                _unlink(tmp)
                raise
            self.fills += 1
            return out
        finally:
            os.close(lock)  # releases the flock

    def _open_existing(self, path: str) -> int | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        return fd

    def _lock(self, lock: int, name: str) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() > deadline:
                raise CacheError(f"block {name}: another process of this node has been fetching it for over "
                                 f"{self.wait_s:.0f}s (cache {self.dir})")
            time.sleep(LOCK_POLL_S)

    def _make_room(self, size: int, keep: str) -> None:
        entries = []
        total = 0
        with os.scandir(self.dir) as it:
            for e in it:
                if e.name.endswith(".lock") or e.name == keep:
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                if e.name.endswith(".part"):
                    if not _alive(e.name):  # left by a process that died mid-fetch
                        _unlink(self.path(e.name))
                        continue
                else:
                    entries.append((st.st_mtime, e.name, st.st_size))
                total += st.st_size
        entries.sort()
        while entries and total + size > self.max_bytes:
            _, name, n = entries.pop(0)
            _unlink(self.path(name))
            total -= n
            log.debug("cache %s: evicted %s (%d bytes)", self.dir, name, n)


def _alive(part_name: str) -> bool:
    """Whether the process that writes ``<block>.<pid>.part`` still runs."""
    try:
        pid = int(part_name.rsplit(".", 2)[-2])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
