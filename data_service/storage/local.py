"""A local folder as a store: a File/FastFile channel, a disk, a registry folder on shared storage."""
from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import tempfile
import threading

from ..errors import ConfigError
from .base import StoreReadError, StoreWriteError, removed_after

CLOCK_PROBE = ".clock-probe"  # touched to read the file system's time (a dot file: never listed)


class LocalStore:
    """Objects as files under ``root`` (see :class:`data_service.storage.base.Store`).

    Ranged reads are ``pread`` calls on descriptors kept open per file, for objects written once
    (shards); a whole-object read opens the file anew, so it sees a file replaced since. Writes go
    to a temporary file in the same folder, renamed into place. ``list`` lists one folder level.

    Args:
        root: the folder. create: make it (and its parents) now if it is missing.
    """

    def __init__(self, root: str, *, create: bool = False) -> None:
        self.url = self.root = os.path.abspath(os.path.expanduser(root))
        if create:
            try:
                os.makedirs(self.root, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"{self.root} cannot be created ({exc}); give a writable folder") from None
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_read = 0
        self.retries = 0

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    def key_url(self, key: str) -> str:
        return os.path.join(self.root, key)

    def _missing(self, key: str) -> StoreReadError:
        return StoreReadError(f"{self.key_url(key)}: no such file; the folder is not a complete `hetero prepare` "
                              f"output (run `hetero prepare SRC {self.root}` to write shards there)",
                              key=key, code="NoSuchKey")

    def _fd(self, key: str) -> int:
        fd = self._fds.get(key)
        if fd is None:
            with self._lock:
                fd = self._fds.get(key)
                if fd is None:
                    try:
                        fd = self._fds[key] = os.open(self.key_url(key), os.O_RDONLY)
                    except FileNotFoundError:
                        raise self._missing(key) from None
        return fd

    def check(self, key: str) -> int:
        if not os.path.isdir(self.root):
            raise ConfigError(f"{self.root}: no such directory; give the folder `hetero prepare` wrote (or an "
                              "s3:// prefix)")
        try:
            return self.size(key)
        except StoreReadError as exc:
            raise ConfigError(str(exc)) from None

    def size(self, key: str) -> int:
        try:
            return os.stat(self.key_url(key)).st_size
        except FileNotFoundError:
            raise self._missing(key) from None

    def exists(self, key: str) -> bool:
        return os.path.exists(self.key_url(key))

    def read(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if start == 0 and end is None:  # a whole object: a file replaced since the last read is seen
            try:
                with open(self.key_url(key), "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                raise self._missing(key) from None
            except OSError as exc:
                raise StoreReadError(f"cannot read {self.key_url(key)} ({exc})", key=key) from None
        else:
            fd = self._fd(key)
            if end is None:
                end = os.fstat(fd).st_size
            data = os.pread(fd, end - start, start)
            if len(data) != end - start:
                raise StoreReadError(f"{self.key_url(key)} ends at {start + len(data)} bytes, before {end}: the file "
                                     "is shorter than the index says; write the shards again", key=key,
                                     code="InvalidRange")
        self.requests += 1
        self.bytes_read += len(data)
        return data

    def list(self, suffix: str = "", under: str = "", versions: bool = False) -> list[tuple]:
        folder = os.path.join(self.root, under) if under else self.root
        if not os.path.isdir(self.root):
            raise ConfigError(f"{self.root}: no such directory (it does not exist or is not a folder)")
        out = []
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    if entry.name.endswith(suffix) and not entry.name.startswith(".") and entry.is_file():
                        st = entry.stat()
                        out.append((entry.name, st.st_size, f"{st.st_ino}-{st.st_mtime_ns}")
                                   if versions else (entry.name, st.st_size))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ConfigError(f"cannot list {folder} ({exc})") from None
        return sorted(out)

    def list_timed(self, suffix: str = "", under: str = "") -> tuple[builtins.list[tuple], float | None]:
        """``(key, size, version, mtime)`` as ``list(versions=True)`` with each file's mtime, and the
        file system's own time now: the mtime of ``CLOCK_PROBE`` at the store's root, touched after
        the listing (None when the folder is read-only). On a network file system both come from
        the server's clock, so comparing them needs no host's clock to be right."""
        # a version is "<inode>-<mtime in ns>" (``list``): the listing's own stat, not a second one
        out = [(name, size, version, int(version.rpartition("-")[2]) / 1e9)
               for name, size, version in self.list(suffix, under, versions=True)]
        probe = os.path.join(self.root, CLOCK_PROBE)
        try:
            open(probe, "ab").close()
            os.utime(probe)  # "now" as the file system sets it (NFS: SET_TO_SERVER_TIME)
            return out, os.stat(probe).st_mtime
        except OSError:
            return out, None

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self.key_url(key)
        folder, name = os.path.split(path)
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{threading.get_ident()}.part")
        try:
            os.makedirs(folder, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # readers see the old file or the new, never half of one
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StoreWriteError(f"{exc}; check that {folder} exists and is writable", key=key) from None

    def write_file(self, key: str, path: str) -> None:
        target = self.key_url(key)
        if os.path.abspath(path) == target:
            return
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(path, target)  # a rename within the file system
        except OSError as exc:
            raise StoreWriteError(f"cannot move {path} to {target} ({exc})", key=key) from None

    def delete(self, key: str) -> None:
        try:
            os.unlink(self.key_url(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreWriteError(f"cannot remove {self.key_url(key)} ({exc})", key=key) from None

    def staging(self):
        os.makedirs(self.root, exist_ok=True)
        return removed_after(tempfile.mkdtemp(prefix=".staging-", dir=self.root))

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
