"""Named files under one folder, shared by every process of a host, within a byte budget.

The shard block cache (:mod:`data_service.shards.cache`) and the decoded-image cache
(:mod:`data_service.pipelines.decoded_cache`) keep their entries this way:

* an entry is written to ``<name>.<pid>.part`` and renamed into place: a reader sees all of it or
  none; the ``.part`` of a process that died is removed by the next fetch;
* ``.cache.lock`` is the folder's lock (``flock``) and holds the bytes and entries stored, kept by
  every writer under that lock (a folder without the count is counted once from its files);
* :meth:`FileCache.fetch` fills a missing entry under its own ``<name>.lock``: a slow fetch runs
  once per host while the other processes wait (with a deadline);
* with ``evict`` the least recently used entries (by modification time, refreshed by every hit)
  make room, and a process with an evicted file open keeps reading it; without it an entry past
  the budget is refused (the first budget's worth stays);
* with ``shared`` every process using the folder holds a shared ``flock`` on ``.users.lock`` (from
  its first use; the kernel drops it when the process dies), and :meth:`FileCache.close` removes
  the folder only when no other process holds one: the last user leaves it clean.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import struct
import time
import weakref
from typing import Callable, Iterable

from ..errors import DataServiceError

log = logging.getLogger(__name__)

COUNTER = struct.Struct("<QQ")  # bytes held, entries held: the start of the folder lock file
FOLDER_LOCK = ".cache.lock"
USERS_LOCK = ".users.lock"
LOCK_POLL_S = 0.01


class CacheError(DataServiceError):
    """An entry could not be cached (its fill failed, or another process held a lock past the deadline)."""


class FileCache:
    """Entries as files under ``directory`` (created), at most ``max_bytes`` together.

    Args:
        directory: the folder. max_bytes: the budget. evict: make room by removing the least
            recently used entries (else refuse entries past the budget). wait_s: the longest a
            process waits for a lock another holds. shared: track the folder's users (:meth:`close`).

    Raises:
        OSError: ``directory`` cannot be created (callers name their option in the error).
    """

    def __init__(self, directory: str, max_bytes: int, *, evict: bool = True, wait_s: float = 600.0,
                 shared: bool = False) -> None:
        os.makedirs(directory, exist_ok=True)
        self.dir = directory
        self.max_bytes = max_bytes
        self.evict = evict
        self.wait_s = wait_s
        self.shared = shared
        self.full = False  # without evict: a put was refused, later ones are not tried
        self._users: weakref.finalize | None = None

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def cached(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def open(self, name: str) -> int | None:
        """A read-only descriptor of entry ``name``, or None when it is not stored."""
        self._attach()
        path = self.path(name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        if self.evict:
            with contextlib.suppress(OSError):
                os.utime(path)  # least recently used goes first
        return fd

    def read(self, name: str) -> bytearray | None:
        """Entry ``name``'s bytes, or None when it is not stored."""
        fd = self.open(name)
        if fd is None:
            return None
        try:
            buf = bytearray(os.fstat(fd).st_size)
            return buf if os.readv(fd, [buf]) == len(buf) else None  # whole: entries are renamed in complete
        finally:
            os.close(fd)

    def put(self, name: str, chunks: Iterable) -> bool:
        """Store ``chunks`` (bytes-like objects, back to back) as entry ``name``; False when refused."""
        if self.full and not self.evict:
            return False
        self._attach()
        part = self._part(name)
        with open(part, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            size = f.tell()
        return self._commit(part, name, size)

    def fetch(self, name: str, size: int, fill: Callable[[int], None]) -> int:
        """A descriptor of entry ``name`` (``size`` bytes), written by ``fill(fd)`` (``os.pwrite``) if absent:
        in one process of the host at a time, after room is made. An entry the budget refuses (no
        ``evict``) is returned all the same, just not kept.

        Raises:
            CacheError: another process held the entry's lock past ``wait_s``; ``fill`` wrote another size.
        """
        def filled() -> int:  # under the entry's lock: room made, a .part file filled and committed
            with self._folder_locked() as folder:
                self._scan(folder, need=size)
            part = self._part(name)
            out = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                fill(out)
                if os.fstat(out).st_size != size:
                    raise CacheError(f"{name}: filled {os.fstat(out).st_size} bytes, expected {size}")
                self._commit(part, name, size)
            except BaseException:
                os.close(out)
                _unlink(part)
                raise
            return out

        return self.once(name, "writing", filled)

    def once(self, name: str, doing: str, make: Callable[[], int]) -> int:
        """A descriptor of entry ``name``, else the one ``make()`` returns, run under the entry's own lock:
        in one process of the host at a time, and never for an entry already stored.

        Raises:
            CacheError: another process held the entry's lock (``doing`` it, the message says) past ``wait_s``.
        """
        fd = self.open(name)
        if fd is not None:
            return fd
        lock = os.open(self.path(name) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            flock(lock, fcntl.LOCK_EX, self.wait_s,
                  lambda: f"{name}: another process of this host has been {doing} it for over {self.wait_s:.0f}s "
                          f"(cache {self.dir})")
            fd = self.open(name)  # another process stored it while this one waited
            return make() if fd is None else fd
        finally:
            os.close(lock)  # releases the flock

    def discard(self, name: str) -> None:
        """Remove entry ``name`` (a copy found damaged) and recount; a process with it open keeps its copy."""
        with self._folder_locked() as folder:
            _unlink(self.path(name))
            self._scan(folder, need=0)

    def held(self) -> tuple[int, int]:
        """(bytes, entries) stored, as the writers counted them."""
        try:
            with open(self.path(FOLDER_LOCK), "rb") as f:
                raw = f.read(COUNTER.size)
        except FileNotFoundError:
            return 0, 0
        return COUNTER.unpack(raw) if len(raw) == COUNTER.size else (0, 0)

    def close(self) -> bool:
        """Stop using the folder and remove it unless another process uses it; True when removed."""
        users, self._users = self._users, None
        held = users.detach() if users is not None else None  # (object, function, (fd,), kwargs)
        try:
            fd = held[2][0] if held else os.open(self.path(USERS_LOCK), os.O_RDWR)
        except FileNotFoundError:  # nobody ever used it
            fd = None
        try:
            if fd is not None:  # shared to exclusive: granted only when no other process holds the shared lock
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(self.dir, ignore_errors=True)
            return True
        except BlockingIOError:
            return False
        finally:
            if fd is not None:
                os.close(fd)

    def remove(self) -> None:
        """Delete the folder and everything in it, whoever still uses it."""
        if self._users is not None:
            self._users()
            self._users = None
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- internals
    def _attach(self) -> None:
        """With ``shared``: hold the shared lock that marks this process as a user of the folder."""
        if not self.shared or self._users is not None:
            return
        path = self.path(USERS_LOCK)
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            os.makedirs(self.dir, exist_ok=True)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except FileNotFoundError:  # the last user removed the folder just now: make it again
                continue
            try:
                flock(fd, fcntl.LOCK_SH, max(0.0, deadline - time.monotonic()),
                      lambda: f"cache {self.dir}: its last user has been removing it for over {self.wait_s:.0f}s")
                if os.fstat(fd).st_ino == os.stat(path).st_ino:  # not a folder removed meanwhile
                    self._users = weakref.finalize(self, os.close, fd)
                    return
            except FileNotFoundError:
                pass
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise CacheError(f"cache {self.dir}: could not join it within {self.wait_s:.0f}s (removed and made "
                         "again over and over)")

    def _part(self, name: str) -> str:
        return f"{self.path(name)}.{os.getpid()}.part"

    @contextlib.contextmanager
    def _folder_locked(self):
        fd = os.open(self.path(FOLDER_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            flock(fd, fcntl.LOCK_EX, self.wait_s,
                  lambda: f"cache {self.dir}: another process has held its lock for over {self.wait_s:.0f}s")
            yield fd
        finally:
            os.close(fd)

    def _commit(self, part: str, name: str, size: int) -> bool:
        """Rename ``part`` into place as ``name`` if the budget allows (evicting with ``evict``)."""
        path = self.path(name)
        with self._folder_locked() as fd:
            if os.path.exists(path):  # another process stored it first
                _unlink(part)
                return True
            raw = os.pread(fd, COUNTER.size, 0)
            held, count = COUNTER.unpack(raw) if len(raw) == COUNTER.size else self._scan(fd, 0, part)
            if held + size > self.max_bytes and self.evict:
                held, count = self._scan(fd, size, part)
            if held + size > self.max_bytes:
                _unlink(part)
                if not self.full:
                    self.full = True
                    log.info("cache %s is full (%d entries, %d of %d bytes): further entries are not kept",
                             self.dir, count, held, self.max_bytes)
                return False
            os.rename(part, path)
            os.pwrite(fd, COUNTER.pack(held + size, count + 1), 0)
            return True

    def _scan(self, fd: int, need: int, own_part: str = "") -> tuple[int, int]:
        """Count the folder from its files (under the folder lock), remove the ``.part`` files of dead
        processes, and with ``evict`` remove the least recently used entries until ``need`` more
        bytes fit beside the entries and the ``.part`` files being written. Writes the count."""
        entries, writing = [], 0
        with os.scandir(self.dir) as it:
            for e in it:
                if e.name.startswith(".") or e.name.endswith(".lock") or e.path == own_part:
                    continue
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                if e.name.endswith(".part"):
                    if _alive(e.name):
                        writing += st.st_size
                    else:  # left by a process that died mid-write
                        _unlink(e.path)
                else:
                    entries.append((st.st_mtime, e.name, st.st_size))
        held = sum(n for _, _, n in entries)
        if self.evict:
            entries.sort()
            while entries and held + writing + need > self.max_bytes:
                _, name, n = entries.pop(0)
                _unlink(self.path(name))
                held -= n
                log.debug("cache %s: evicted %s (%d bytes)", self.dir, name, n)
        os.pwrite(fd, COUNTER.pack(held, len(entries)), 0)
        return held, len(entries)


def flock(fd: int, op: int, wait_s: float, timeout_message: Callable[[], str]) -> None:
    """``flock(fd, op)``, waiting at most ``wait_s`` for another holder (then CacheError)."""
    deadline = time.monotonic() + wait_s
    delay = 0.0005
    while True:
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return
        if time.monotonic() > deadline:
            raise CacheError(timeout_message())
        time.sleep(delay)
        delay = min(2 * delay, LOCK_POLL_S)


def _alive(part_name: str) -> bool:
    """Whether the process that writes ``<entry>.<pid>.part`` still runs."""
    try:
        os.kill(int(part_name.rsplit(".", 2)[-2]), 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        pass
    return True


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
