"""Per-sample CRC32C checksums: computed when an index is written, checked on every read of a sample.

``index.bin`` version 4 holds one CRC32C (Castagnoli, ``<u4``) per sample over everything training
reads of it: the sample's bytes as stored in its shard, then its label as the labels column stores
it (4 bytes, ``<i4``): :func:`sample_crc`. A reader checks both on every read, so a label that
rots in the index after a node opened it is named at the next read. A CRC detects every change
of 32 bits or fewer, so any change of a label changes the checksum, and the label the bytes and
checksum agree on can be worked back (:func:`label_of`): a reader tells a damaged label from
damaged bytes. A reader that finds other bytes drops the copy it read (an S3 block in the node's
cache), reads the source once more, and only then reports the sample: :class:`CorruptSampleError`
naming the shard, sample, byte range and both checksums, which the image pipeline turns into an
error or, with ``on_corrupt="skip"``, a counted skip. ``data_service.crc32c`` computes it with the
CPU's CRC instruction over the bytes where they lie, so a check costs far less than a decode.

Version 3 checksums cover the bytes alone: :func:`check_labels` compares its labels column with
the CRC-32 its header holds, once per node and index file, and a reader says once that labels
are otherwise unchecked and that ``hetero index --upgrade`` adds them.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import struct
import threading
import zlib

import numpy as np

from ..crc32c import crc32c  # of any buffer in place; the shards' readers and writers import it from here
from ..errors import ConfigError, DataServiceError
from ..storage import LocalStore
from .format import FIX, INDEX_NAME, Coverage

log = logging.getLogger(__name__)

_LABEL = struct.Struct("<i")  # a label as the labels column holds it
RANGE = 64 << 20  # bytes per read when a shard is read back to compute its checksums

_warned: set[str] = set()
_warned_lock = threading.Lock()


class CorruptSampleError(DataServiceError, ValueError):
    """A sample's bytes do not match the checksum its index holds, after a second read from the source."""


def sample_crc(data_crc: int, label: int) -> int:
    """A sample's checksum in index.bin version 4: the CRC32C of its bytes (``data_crc``) continued
    over its label as 4 little-endian bytes (``<i4``, as the labels column holds it)."""
    return crc32c(_LABEL.pack(label), int(data_crc))


class _Tables:
    """CRC32C is affine over GF(2): ``sample_crc(c, L) = P(c) ^ Q(L) ^ K``, with ``P`` and ``Q``
    linear maps of 32 bits. Byte tables of ``P`` and ``Q`` give :func:`sample_crcs` for whole
    columns at numpy speed; ``Q`` is invertible (a CRC-32 sees every change of 32 bits or fewer), so
    :func:`label_of` works a label back from a checksum."""

    def __init__(self) -> None:
        self.k = sample_crc(0, 0)
        self.p = np.array([[sample_crc(b << (8 * j), 0) ^ self.k for b in range(256)] for j in range(4)], "<u4")
        self.q = np.array([[sample_crc(0, _signed(b << (8 * j))) ^ self.k for b in range(256)] for j in range(4)],
                          "<u4")
        # Q's inverse: Gaussian elimination on the images of single bits, each with the bits it came from
        pivots: dict[int, tuple[int, int]] = {}
        for k in range(32):
            value, source = sample_crc(0, _signed(1 << k)) ^ self.k, 1 << k
            while value:
                top = value.bit_length() - 1
                if top not in pivots:
                    pivots[top] = (value, source)
                    break
                value, source = value ^ pivots[top][0], source ^ pivots[top][1]
        self.pivots = sorted(pivots.items(), reverse=True)

    def solve(self, y: int) -> int:
        """The ``x`` with ``Q(x) == y``."""
        x = 0
        for top, (value, source) in self.pivots:
            if y >> top & 1:
                y, x = y ^ value, x ^ source
        return x


@functools.cache
def _table() -> _Tables:
    return _Tables()


def _signed(x: int) -> int:
    return x - (1 << 32) if x >= 1 << 31 else x


def sample_crcs(data_crcs, labels) -> np.ndarray:
    """:func:`sample_crc` of each sample, for whole columns (``<u4`` CRC32Cs of the bytes, ``<i4`` labels)."""
    t = _table()
    c = np.ascontiguousarray(data_crcs, dtype="<u4")
    lab = np.ascontiguousarray(labels, dtype="<i4").view("<u4")
    out = np.full(len(c), t.k, dtype="<u4")
    for j in range(4):
        out ^= t.p[j][(c >> (8 * j)) & 0xFF] ^ t.q[j][(lab >> (8 * j)) & 0xFF]
    return out


def label_of(data_crc: int, crc: int) -> int:
    """The one label ``L`` (an ``<i4``) with ``sample_crc(data_crc, L) == crc``: the label that a
    sample's bytes and its checksum agree on."""
    return _signed(_table().solve(int(crc) ^ sample_crc(data_crc, 0)))


def sample_checksums(store, name: str, offsets, lengths) -> np.ndarray:
    """The CRC32C of each sample's bytes in shard ``name`` of ``store`` (``offsets``/``lengths`` in byte
    order; :func:`sample_crcs` adds the labels), read in ranges of at most :data:`RANGE` bytes."""
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


def note_unchecked(where: str, index_bin: bool, folder: str) -> None:
    """Log once per process and index that its samples carry no checksums, and the command that adds them."""
    if not first_time(where):
        return
    log.warning("%s holds no per-sample checksums (%s): samples and labels are read unchecked; run `%s` to add "
                "them", where, "an index.bin of an earlier release" if index_bin else "an index.json",
                _upgrade(folder, index_bin))


def note_labels_unchecked(where: str, folder: str) -> None:
    """Log once per process and index that its checksums cover the samples' bytes, not their labels."""
    if not first_time(where):
        return
    log.warning("%s: its per-sample checksums cover the samples' bytes, not their labels (index.bin version 3): "
                "the labels column is checked once per node when the data set opens, a label damaged after that "
                "is read unchecked; run `%s` to put each label in its sample's checksum", where,
                _upgrade(folder, True))


def _upgrade(folder: str, index_bin: bool) -> str:
    return f"hetero index --upgrade {folder}" if index_bin else f"hetero index --from-json {folder}"


def first_time(where: str) -> bool:
    """Whether this process meets ``where`` (an index, a file) for the first time: what is said once per process."""
    with _warned_lock:
        if where in _warned:
            return False
        _warned.add(where)
        return True


def check_labels(index, store, cache_dir: str) -> None:
    """``index``'s labels column against the CRC-32 in the header of ``store``'s index.bin, once per
    node and index file (a marker under ``cache_dir``; a local file written again is checked again),
    where the per-sample checksums do not cover the labels (versions 2 and 3; version 4 checks each
    label on every read; an index.json has no column checksums).

    A label flipped in a damaged copy of the index, still within the classes, would train silently;
    the pass costs 4 bytes per sample (0.4 GB at 100 M samples), hence once per node.

    Raises:
        ConfigError: the column does not match, naming the index and the fix.
    """
    where = index.shards.where or f"{store.url}/{INDEX_NAME}"
    if index.coverage is Coverage.BYTES_LABEL or not where.endswith(INDEX_NAME):
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

