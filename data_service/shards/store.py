"""Where shard bytes come from: a local folder (a File/FastFile channel, a disk) or ``s3://``.

Both stores answer the same three questions, so the shard dataset does not know which it has:
``read(key, start, end)`` (one ranged read), ``size(key)``, ``list(suffix)``.
"""
from __future__ import annotations

import os
import threading

from ..errors import ConfigError


class LocalStore:
    """Shards in a folder. Reads are ``pread`` calls on descriptors kept open per file."""

    def __init__(self, root: str) -> None:
        self.url = self.root = os.path.abspath(os.path.expanduser(root))
        if not os.path.isdir(self.root):
            raise ConfigError(f"shards={root!r}: no such directory; give the folder `hetero prepare` wrote (or "
                              "an s3:// prefix)")
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_read = 0
        self.retries = 0

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def _fd(self, key: str) -> int:
        fd = self._fds.get(key)
        if fd is None:
            with self._lock:
                fd = self._fds.get(key)
                if fd is None:
                    try:
                        fd = self._fds[key] = os.open(self._path(key), os.O_RDONLY)
                    except FileNotFoundError:
                        raise ConfigError(f"{self._path(key)}: no such file; the folder is not a complete "
                                          "`hetero prepare` output") from None
        return fd

    def check(self, key: str) -> int:
        return self.size(key)

    def size(self, key: str) -> int:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError:
            raise ConfigError(f"{self._path(key)}: no such file; run `hetero prepare SRC {self.root}` to write "
                              "shards there") from None

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def read(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        fd = self._fd(key)
        if end is None:
            end = os.fstat(fd).st_size
        data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise ConfigError(f"{self._path(key)} ends at {start + len(data)} bytes, before {end}: the file is "
                              "shorter than the index says; write the shards again")
        self.requests += 1
        self.bytes_read += len(data)
        return data

    def list(self, suffix: str = "") -> list[tuple[str, int]]:
        out = []
        for name in sorted(os.listdir(self.root)):
            if name.endswith(suffix) and not name.startswith("."):
                out.append((name, os.stat(self._path(name)).st_size))
        return out

    def write_bytes(self, key: str, data: bytes) -> None:
        tmp = self._path(f".{key}.{os.getpid()}.part")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self._path(key))

    def write_file(self, key: str, path: str) -> None:
        if os.path.abspath(path) != self._path(key):
            os.replace(path, self._path(key))

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def open_store(location: str, **s3_options):
    """A :class:`LocalStore` for a folder, an ``S3Store`` for ``s3://bucket/prefix``."""
    if not isinstance(location, str) or not location:
        raise ConfigError(f"shards={location!r} must be a folder or an s3://bucket/prefix")
    if location.startswith("s3://"):
        from .s3 import S3Store

        return S3Store(location, **s3_options)
    if "://" in location:
        raise ConfigError(f"shards={location!r}: only local folders and s3:// prefixes are supported")
    return LocalStore(location)
