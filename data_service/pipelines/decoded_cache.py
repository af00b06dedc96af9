"""Decoded images kept in RAM after their first decode, for data sets that fit.

From the second epoch on, a cached image costs a crop and a resize instead of a JPEG decode (about
a quarter of the time per image: docs/benchmarks.md, "Fused crop and decode"). Images are kept at
a bounded size, short side ``side`` (by default 1.15 x the crop size), as uint8 HWC, in a tmpfs
folder (``/dev/shm``) that every worker process of a data server, and every server of the same
pipeline on the host, shares: each image is decoded once per host. Entries are named by a hash of
the encoded bytes, so a changed file is never served stale. Nothing is evicted: once ``budget``
bytes are held, further images are decoded every epoch (the first ``budget`` bytes' worth stay).

The image a batch is built from does not depend on whether the cache held it: a miss decodes,
shrinks to ``side`` and then crops, exactly as a hit crops the stored copy, so batches stay
bit-identical across cluster shapes and modes. They differ from the uncached pipeline's (crops are
taken from the shrunken image), which is why the cache is an option, off by default.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import struct

import torch

from ..errors import ConfigError

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")  # rows, cols; then rows x cols x 3 bytes
COUNTER = struct.Struct("<QQ")  # bytes held, images held: in the lock file
LOCK_NAME = ".lock"


class DecodedCache:
    """A bounded, host-wide store of decoded images under ``root``.

    Args:
        root: the folder (created; on tmpfs for RAM speed). budget: most bytes of images held.

    Raises:
        ConfigError: ``root`` cannot be created, or its file system has less room than ``budget``.
    """

    def __init__(self, root: str, budget: int) -> None:
        self.root = root
        self.budget = budget
        self.full = False
        try:
            os.makedirs(root, exist_ok=True)
            free = shutil.disk_usage(root).free
        except OSError as exc:
            raise ConfigError(f"decoded_cache_dir: cannot use {root!r} ({exc.strerror or exc}); give a writable "
                              "folder on a tmpfs such as /dev/shm") from None
        held = self._counter()[0]
        if budget > free + held:
            raise ConfigError(f"decoded_cache_bytes={budget} does not fit: {root!r} has {free} bytes free; lower "
                              "decoded_cache_bytes or give decoded_cache_dir on a larger tmpfs (docker: --shm-size)")

    @staticmethod
    def key(data: bytes) -> str:
        """The entry name of an encoded image: a hash of its bytes."""
        return hashlib.blake2b(data, digest_size=16).hexdigest()

    def get(self, key: str) -> torch.Tensor | None:
        """The stored image (uint8 ``[rows, cols, 3]``), or None."""
        try:
            fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            buf = bytearray(os.fstat(fd).st_size)
            got = os.readv(fd, [buf])
        finally:
            os.close(fd)
        if got < HEADER.size:
            return None
        rows, cols = HEADER.unpack_from(buf)
        if got != HEADER.size + rows * cols * 3:
            return None
        return torch.frombuffer(buf, dtype=torch.uint8, offset=HEADER.size).view(rows, cols, 3)

    def put(self, key: str, image: torch.Tensor) -> bool:
        """Store ``image`` (uint8 ``[rows, cols, 3]``) unless the budget is spent; True when held."""
        if self.full:
            return False
        rows, cols = image.shape[:2]
        size = HEADER.size + rows * cols * 3
        path = os.path.join(self.root, key)
        fd = os.open(os.path.join(self.root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one writer at a time across processes: the counter stays exact
            held, count = self._read_counter(fd)
            if os.path.exists(path):
                return True
            if held + size > self.budget:
                self.full = True
                log.info("decoded-image cache %s is full (%d images, %d of %d bytes): further images are decoded "
                         "every epoch", self.root, count, held, self.budget)
                return False
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(HEADER.pack(rows, cols))
                f.write(memoryview(image.contiguous().numpy()).cast("B"))
            os.replace(tmp, path)
            os.pwrite(fd, COUNTER.pack(held + size, count + 1), 0)
            return True
        finally:
            os.close(fd)

    def stats(self) -> dict[str, float]:
        """Bytes and images held, and the budget (for the data server's stats)."""
        held, count = self._counter()
        return {"decoded_cache_bytes": float(held), "decoded_cache_images": float(count),
                "decoded_cache_budget_bytes": float(self.budget)}

    def remove(self) -> None:
        """Delete the folder and everything in it (the data server's shutdown)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def _counter(self) -> tuple[int, int]:
        try:
            fd = os.open(os.path.join(self.root, LOCK_NAME), os.O_RDONLY)
        except FileNotFoundError:
            return 0, 0
        try:
            return self._read_counter(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _read_counter(fd: int) -> tuple[int, int]:
        raw = os.pread(fd, COUNTER.size, 0)
        return COUNTER.unpack(raw) if len(raw) == COUNTER.size else (0, 0)
