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
"""
from __future__ import annotations

import hashlib
import shutil
import struct

import torch

from ..errors import ConfigError
from ..storage.filecache import FileCache

HEADER = struct.Struct("<II")  # rows, cols; then rows x cols x 3 bytes


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
        """The stored image (uint8 ``[rows, cols, 3]``), or None."""
        buf = self.files.read(key)
        if buf is None or len(buf) < HEADER.size:
            return None
        rows, cols = HEADER.unpack_from(buf)
        if len(buf) != HEADER.size + rows * cols * 3:
            return None
        return torch.frombuffer(buf, dtype=torch.uint8, offset=HEADER.size).view(rows, cols, 3)

    def put(self, key: str, image: torch.Tensor) -> bool:
        """Store ``image`` (uint8 ``[rows, cols, 3]``) unless the budget is spent; True when held."""
        rows, cols = image.shape[:2]
        return self.files.put(key, [HEADER.pack(rows, cols), memoryview(image.contiguous().numpy()).cast("B")])

    def stats(self) -> dict[str, float]:
        """Bytes and images held, and the budget (for the data server's stats)."""
        held, count = self.files.held()
        return {"decoded_cache_bytes": float(held), "decoded_cache_images": float(count),
                "decoded_cache_budget_bytes": float(self.budget)}

    def close(self) -> None:
        """Stop using the cache; the folder is removed unless another process (of this or another
        server of the same pipeline) still uses it (the data server's shutdown)."""
        self.files.close()

    def remove(self) -> None:
        """Delete the folder and everything in it, whoever still uses it."""
        self.files.remove()
