"""Decoded images kept in RAM after their first decode, for data sets that fit.

From the second epoch on, a cached image costs a crop and a resize instead of a JPEG decode (about
a quarter of the time per image: docs/benchmarks.md, "Fused crop and decode"). Images are kept at
a bounded size, short side ``side`` (by default 1.15 x the crop size), as uint8 HWC, in a tmpfs
folder (``/dev/shm``) that every worker process of a data server, and every server of the same
pipeline on the host, shares: each image is decoded once per host (the files, locks and budget are
:class:`data_service.storage.filecache.FileCache`'s). Entries are named by a hash of the encoded bytes, so a
changed file is never served stale. Nothing is evicted: once ``budget`` bytes are held, further
images are decoded every epoch (the first ``budget`` bytes' worth stay). The folder goes with the
last process that uses it: a server that shuts down or drains leaves it to the servers that stay.

The image a batch is built from does not depend on whether the cache held it: a miss decodes,
shrinks to ``side`` and then crops, exactly as a hit crops the stored copy, so batches stay
bit-identical across cluster shapes and modes. They differ from the uncached pipeline's (crops are
taken from the shrunken image), which is why the cache is an option, off by default.

Each entry carries a CRC32C over its shape and pixels, checked on every hit: an entry that fails it
(host memory or a tmpfs page gone bad, a process that wrote past its buffer) is dropped, counted
(``decoded_cache_damaged``, and the sample in the data server's ``samples_reread``) and reads as a
miss, so the image is decoded again from its source, whose bytes the sample source has checked.
The check reads the entry in place (no copy): about 40 us for a 258 x 344 image, +6 % of a batch
served from the cache (docs/images.md, "Decoded-image cache"; ``benchmarks.decoded_cache_cost``).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import struct

import numpy as np
import torch

from ..contract.pipeline import count_reread
from ..errors import ConfigError
from ..crc32c import crc32c as _crc32c
from ..storage.filecache import FileCache

log = logging.getLogger(__name__)

MAGIC = b"HDCIMG2\n"  # an entry: MAGIC, rows, cols, CRC32C of (rows, cols) then the pixels; then rows x cols x 3 bytes
HEADER = struct.Struct("<8sIII")
DAMAGED = ".damaged"  # one byte appended per entry found damaged, by any process of the host: the count


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
        try:
            self.files = FileCache(root, budget, evict=False, shared=True)
            free = shutil.disk_usage(root).free
        except OSError as exc:
            raise ConfigError(f"decoded_cache_dir: cannot use {root!r} ({exc.strerror or exc}); give a writable "
                              "folder on a tmpfs such as /dev/shm") from None
        if budget > free + self.files.held()[0]:
            raise ConfigError(f"decoded_cache_bytes={budget} does not fit: {root!r} has {free} bytes free; lower "
                              "decoded_cache_bytes or give decoded_cache_dir on a larger tmpfs (docker: --shm-size)")

    @staticmethod
    def key(data: bytes) -> str:
        """The entry name of an encoded image: a hash of its bytes."""
        return hashlib.blake2b(data, digest_size=16).hexdigest()

    def get(self, key: str) -> torch.Tensor | None:
        """The stored image (uint8 ``[rows, cols, 3]``), or None: not stored, or stored and found
        damaged (then dropped and counted: the caller decodes it again)."""
        buf = self.files.read(key)
        if buf is None:
            return None
        if not intact(buf):
            self._drop(key, len(buf))
            return None
        rows, cols = HEADER.unpack_from(buf)[1:3]
        return torch.frombuffer(buf, dtype=torch.uint8, offset=HEADER.size).view(rows, cols, 3)

    def put(self, key: str, image: torch.Tensor) -> bool:
        """Store ``image`` (uint8 ``[rows, cols, 3]``) unless the budget is spent; True when held."""
        pixels = image.contiguous().numpy().reshape(-1)
        rows, cols = image.shape[:2]
        shape = struct.pack("<II", rows, cols)
        return self.files.put(key, [HEADER.pack(MAGIC, rows, cols, _crc32c(pixels, _crc32c(shape))),
                                    pixels.data])

    def stats(self) -> dict[str, float]:
        """Bytes and images held, the budget, and entries found damaged (for the data server's stats)."""
        held, count = self.files.held()
        try:
            damaged = os.stat(os.path.join(self.root, DAMAGED)).st_size
        except FileNotFoundError:
            damaged = 0
        return {"decoded_cache_bytes": float(held), "decoded_cache_images": float(count),
                "decoded_cache_budget_bytes": float(self.budget), "decoded_cache_damaged": float(damaged)}

    def _drop(self, key: str, size: int) -> None:
        """Remove a damaged entry and count it (host-wide, and as a sample read again)."""
        self.files.discard(key)
        count_reread()
        with contextlib.suppress(OSError):  # the folder went with its last user: nothing left to count in
            fd = os.open(os.path.join(self.root, DAMAGED), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, b"x")  # O_APPEND: one byte per entry, whichever process finds it
            finally:
                os.close(fd)
        log.warning("decoded-image cache %s: entry %s (%d bytes) fails its CRC32C; dropped, and the image is "
                    "decoded again from its source", self.root, key, size)

    def close(self) -> None:
        """Stop using the cache; the folder is removed unless another process (of this or another
        server of the same pipeline) still uses it (the data server's shutdown)."""
        self.files.close()

    def remove(self) -> None:
        """Delete the folder and everything in it, whoever still uses it."""
        self.files.remove()


def intact(buf) -> bool:
    """Whether ``buf`` (an entry's bytes) is whole: its magic, its length for its shape, its CRC32C."""
    if len(buf) < HEADER.size:
        return False
    magic, rows, cols, crc = HEADER.unpack_from(buf)
    if magic != MAGIC or len(buf) != HEADER.size + rows * cols * 3:
        return False
    return _crc32c(np.frombuffer(buf, dtype=np.uint8, offset=HEADER.size), _crc32c(bytes(buf[8:16]))) == crc

