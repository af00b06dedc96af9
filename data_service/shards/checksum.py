"""Per-sample CRC32C checksums: computed when an index is written, checked on every read of a sample.

``index.bin`` version 3 holds one CRC32C (Castagnoli, ``<u4``) per sample over the sample's
bytes as stored in its shard. A reader that finds other bytes drops the copy it read (an S3
block in the node's cache), reads the source once more, and only then reports the sample:
:class:`CorruptSampleError` naming the shard, sample, byte range and both checksums, which the
image pipeline turns into an error or, with ``on_corrupt="skip"``, a counted skip. ``data_service.crc32c``
computes it with the CPU's CRC instruction over the bytes where they lie, so a check costs far less than a decode.

A sample's CRC32C covers its bytes, not its label: :func:`check_labels` compares index.bin's labels
column with the CRC-32 its header holds, once per node and index file.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import zlib

import numpy as np

from ..crc32c import crc32c  # of any buffer in place; the shards' readers and writers import it from here
from ..errors import ConfigError, DataServiceError
from ..storage import LocalStore
from .format import FIX, INDEX_NAME

log = logging.getLogger(__name__)

RANGE = 64 << 20  # bytes per read when a shard is read back to compute its checksums

_warned: set[str] = set()
_warned_lock = threading.Lock()


class CorruptSampleError(DataServiceError, ValueError):
    """A sample's bytes do not match the checksum its index holds, after a second read from the source."""


def sample_checksums(store, name: str, offsets, lengths) -> np.ndarray:
    """The CRC32C of each sample of shard ``name`` of ``store`` (``offsets``/``lengths`` in byte order),
    read in ranges of at most :data:`RANGE` bytes."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros(len(offsets), dtype="<u4")
    j = 0
    while j < len(offsets):
        start = int(offsets[j])
        k = j + 1  # the samples whose bytes fit one read (at least one, however large)
        while k < len(offsets) and int(offsets[k] + lengths[k]) - start <= RANGE:
            k += 1
        buf = store.read(name, start, int(offsets[k - 1] + lengths[k - 1]))
        for i in range(j, k):
            a = int(offsets[i]) - start
            out[i] = crc32c(buf[a:a + int(lengths[i])])
        j = k
    return out


def note_unchecked(where: str) -> None:
    """Log once per process and index that its samples carry no checksums, and how to add them."""
    with _warned_lock:
        if where in _warned:
            return
        _warned.add(where)
    log.warning("%s holds no per-sample checksums (an older index.bin or an index.json): samples are read "
                "unchecked; run `hetero index` on the shards again (or `hetero index --from-json` for an "
                "index.json) to add them", where)


def check_labels(index, store, cache_dir: str) -> None:
    """``index``'s labels column against the CRC-32 in the header of ``store``'s index.bin, once per
    node and index file (a marker under ``cache_dir``; a local file written again is checked again).

    A label flipped in a damaged copy of the index, still within the classes, would train silently;
    the pass costs 4 bytes per sample (0.4 GB at 100 M samples), hence once per node.

    Raises:
        ConfigError: the column does not match, naming the index and the fix.
    """
    where = index.shards.where or f"{store.url}/{INDEX_NAME}"
    if not where.endswith(INDEX_NAME):  # an index.json: no column checksums to compare with
        return
    key = [store.url, index.id]
    if isinstance(store, LocalStore):
        st = os.stat(store.key_url(INDEX_NAME))
        key += [st.st_size, st.st_mtime_ns, st.st_ino]
    marker = os.path.join(cache_dir, "checked", f"labels-{hashlib.sha256(repr(key).encode()).hexdigest()[:24]}")
    if os.path.exists(marker):
        return
    # index.bin opens with magic (8 bytes), version, header length and header CRC (4 each; see
    # indexfile, which imports this module, so its PREFIX is not imported here)
    length = int.from_bytes(store.read(INDEX_NAME, 12, 16), "little")
    want = json.loads(store.read(INDEX_NAME, 20, 20 + length))["columns"]["labels"].get("crc32")
    got = zlib.crc32(index.labels)
    if want is not None and got != int(want):
        raise ConfigError(f"{where}: its labels column has CRC-32 {got:08x}, its header says {int(want):08x}: the "
                          f"index was damaged after it was written, and samples would train with wrong labels; {FIX}")
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        open(marker, "a").close()
