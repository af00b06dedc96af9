"""The storage interface every store implements, and the errors a store raises."""
from __future__ import annotations

import builtins
import contextlib
import shutil
from typing import Iterator, Protocol

from ..errors import DataServiceError

NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})  # codes of an object that is not there


class StoreError(DataServiceError):
    """A storage call failed for good (after its retries, or at once when retrying cannot help).

    Attributes:
        bucket, key: where (``bucket`` is "" for a folder). code: the storage's error code
        ("NoSuchKey", "AccessDenied", "Deadline", ...). retryable: transient failures outlasted
        the retries or the deadline.
    """

    def __init__(self, message: str, *, bucket: str = "", key: str = "", code: str = "",
                 retryable: bool = False) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.key = key
        self.code = code
        self.retryable = retryable

    @property
    def missing(self) -> bool:
        """The object is not there (removed, or never written)."""
        return self.code in NOT_FOUND


class StoreReadError(StoreError):
    """Reading (GET, HEAD, LIST) an object failed for good."""


class StoreWriteError(StoreError):
    """Writing or deleting an object failed for good."""


class Store(Protocol):
    """Objects under one location (a folder or an S3 prefix), named by keys relative to it.

    Keys may hold "/" (``servers/a.json``). ``check`` and ``list`` run when a job starts and raise
    ``ConfigError`` naming the location and the fix; the other calls raise :class:`StoreError`
    subclasses. Counters: ``requests``, ``bytes_read``, ``retries``.
    """

    url: str
    requests: int
    bytes_read: int
    retries: int

    def key_url(self, key: str) -> str:
        """Where ``key`` lives, for messages (a path or an ``s3://`` URL)."""

    def check(self, key: str) -> int:
        """The size of ``key``; ConfigError naming the location and the fix when it cannot be read."""

    def size(self, key: str) -> int:
        """The size of ``key`` in bytes."""

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""

    def read(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of ``key`` (end None: to its end): exactly that many, or an error."""

    def list(self, suffix: str = "", under: str = "", versions: bool = False) -> list[tuple]:
        """``(key, size)`` of the objects under ``under`` (a key prefix; "" = everything) whose key
        ends with ``suffix``, keys relative to ``under``, in key order. ``versions``: ``(key, size,
        version)``, the version changing whenever the object is written again. A missing location
        raises ConfigError; a missing ``under`` lists nothing."""

    def list_timed(self, suffix: str = "", under: str = "") -> tuple[builtins.list[tuple], float | None]:
        """``(key, size, version, modified)`` of ``list(versions=True)`` with the time each object
        was last written, and the storage's own time now (None when it cannot tell), both Unix time
        on the storage's clock: an object's age without trusting any host's clock."""

    def write_bytes(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key`` atomically: readers see the old object or the new, never part."""

    def write_file(self, key: str, path: str) -> None:
        """Store the file at ``path`` under ``key`` (a folder store moves it; ``path`` is not used after)."""

    def delete(self, key: str) -> None:
        """Delete ``key`` (nothing happens when it is not there)."""

    def staging(self) -> contextlib.AbstractContextManager[str]:
        """A local folder to write files in before ``write_file`` (removed on exit): inside a folder
        store (so ``write_file`` is a rename), a temporary folder for S3."""

    def close(self) -> None:
        """Free what the store holds open (descriptors, connection pools)."""


@contextlib.contextmanager
def removed_after(folder: str) -> Iterator[str]:
    """Yield ``folder``; remove it and what it holds on exit."""
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
