"""The shard layout: WebDataset-compatible tar files plus an index that makes any sample one ranged read.

A prefix (a local folder or ``s3://bucket/prefix``) holds::

    shard-000000.tar   <key>.jpg (or .png, the bytes as they were) + <key>.cls (the label, ASCII)
    shard-000001.tar   ...
    index.bin          classes, shards, and per sample: byte offset of its data, length, label, CRC32C

The tar files are plain ustar archives, so the ``webdataset`` library (and ``tar tf``) reads them
unchanged. Samples are numbered in the order they were written, shard after shard, so a run of
consecutive sample indices is one contiguous stretch of bytes in each shard it touches: a shuffle
block (``data_service.contract.sampler``) is a handful of large ranged reads.

``index.bin`` (:mod:`.indexfile`) holds the columns as binary arrays that every process of a node
maps from one file: a process's memory and its time to open the index do not grow with the
number of samples. A shard's entries are checked when the shard is first used (its samples lie
within it in byte order without overlapping, its labels within the classes; vectorised over the
shard, once per process, :mod:`.entries`): a corrupt entry refuses its sample with a ConfigError
naming the index, shard, sample, value and fix, never bytes or a label handed to training.
``index.json`` (version 1: the columns in base64 in one JSON document, parsed into each process)
is still read; ``hetero index --from-json`` writes its ``index.bin``.

Shard names are paths relative to the prefix: ``a/b.tar`` is allowed, ``..``, an absolute path,
an empty part or a backslash is not.
"""
from __future__ import annotations

import base64
import enum
import hashlib
import json
import logging
import operator
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import ConfigError
from . import entries
from .entries import CorruptEntryError

log = logging.getLogger(__name__)

INDEX_NAME = "index.bin"  # what ``hetero prepare`` writes and a reader looks for first
JSON_INDEX_NAME = "index.json"  # version 1, still read
FORMAT = "hetero-shards"
VERSION = 1  # of index.json
SHARD_PATTERN = "shard-{:06d}.tar"
TAR_BLOCK = 512
CHECK_CHUNK = 1 << 20  # samples checked per read: bounds the memory a check of a huge shard takes
FIX = "write the prefix again with `hetero prepare` (or `hetero index` for tars written elsewhere)"


class Coverage(enum.Enum):
    """What an index's per-sample checksums cover (what a read of a sample checks)."""

    NONE = "none"  # index.json, index.bin version 2: nothing
    BYTES = "bytes"  # index.bin version 3: the sample's bytes
    BYTES_LABEL = "bytes+label"  # index.bin version 4: its bytes, then its label


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: its name under the prefix, size in bytes, and the samples it holds."""

    name: str
    size: int
    first: int
    count: int


def check_name(name: str, where: str = "") -> str:
    """``name`` when it is a safe relative key (``a/b.tar`` yes; ``..``, ``/abs``, ``a//b``, ``a\\b`` no)."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"{where + ': ' if where else ''}shard name {name!r} is not a relative path below the "
                          "prefix (no '..', no leading '/', no empty part); name the shards by their place under it")
    return name


class ShardTable(Sequence):
    """The shards as columns: ``first`` (``count + 1`` cumulative sample numbers), ``sizes`` and names.

    Indexing gives a :class:`ShardInfo`; nothing per shard is held as a Python object, so a table
    of a million shards costs its arrays (which may be mapped from the index file).
    """

    def __init__(self, first: np.ndarray, sizes: np.ndarray, name_ends: np.ndarray, names: bytes | np.ndarray,
                 where: str = "") -> None:
        self.first, self.sizes, self.name_ends, self._names, self.where = first, sizes, name_ends, names, where

    @classmethod
    def of(cls, shards: Sequence[ShardInfo]) -> "ShardTable":
        """A table of ``ShardInfo`` rows (which must follow one another: ``first`` of each = the sum before it)."""
        if isinstance(shards, ShardTable):
            return shards
        first = np.zeros(len(shards) + 1, dtype=np.int64)
        expected = 0
        for k, s in enumerate(shards):
            check_name(s.name)
            if s.first != expected or s.count < 0 or s.size < 0:
                raise ConfigError(f"shard entry {s} does not follow the one before it (first={expected} expected)")
            expected += s.count
            first[k + 1] = expected
        names = [s.name.encode() for s in shards]
        return cls(first, np.array([s.size for s in shards], dtype=np.int64),
                   np.cumsum([len(n) for n in names], dtype=np.int64), b"".join(names))

    def __len__(self) -> int:
        return len(self.sizes)

    def name(self, k: int) -> str:
        start = int(self.name_ends[k - 1]) if k else 0
        raw = bytes(self._names[start:int(self.name_ends[k])])
        try:
            return check_name(raw.decode(), self.where)
        except UnicodeDecodeError:
            raise ConfigError(f"{self.where}: shard {k}'s name is not UTF-8; {FIX}") from None

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        k = int(k)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(f"shard {k} is outside 0..{len(self) - 1}")
        first = int(self.first[k])
        return ShardInfo(self.name(k), int(self.sizes[k]), first, int(self.first[k + 1]) - first)


class ShardIndex:
    """Where every sample lies: ``offsets[i]``/``lengths[i]`` in shard ``shard_at(i)``, label ``labels[i]``.

    The columns are numpy arrays in compact dtypes (offsets ``<i8``, lengths ``<u4``, labels
    ``<i4``); an index read from ``index.bin`` maps them from the file (read-only). ``shards`` is
    a :class:`ShardTable` (indexing it gives :class:`ShardInfo`). ``id`` names the index's
    contents (caches key on it).
    """

    def __init__(self, classes: list[str], shards: Sequence[ShardInfo], offsets: np.ndarray, lengths: np.ndarray,
                 labels: np.ndarray, *, data_bytes: int | None = None, id: str = "",
                 checksums: np.ndarray | None = None, coverage: Coverage | None = None) -> None:
        self.classes = list(classes)
        self.shards = ShardTable.of(shards)
        self.offsets = _column(offsets, "<i8")
        self.lengths = _column(lengths, "<u4")
        self.labels = _column(labels, "<i4")
        n = int(self.shards.first[-1])
        if not len(self.offsets) == len(self.lengths) == len(self.labels) == n:
            raise ConfigError(f"{self.shards.where or 'index'}: {len(self.offsets)} offsets, {len(self.lengths)} "
                              f"lengths and {len(self.labels)} labels for shards holding {n} samples; {FIX}")
        # CRC32C of each sample (checksum.sample_crc: its bytes, then its label; version 3: its bytes
        # alone, ``coverage`` says which); None: an older index, samples unchecked
        self.checksums = None if checksums is None else _column(checksums, "<u4")
        self.coverage = Coverage.NONE if checksums is None else coverage or Coverage.BYTES_LABEL
        if self.checksums is not None and len(self.checksums) != n:
            raise ConfigError(f"{self.shards.where or 'index'}: {len(self.checksums)} checksums for {n} samples; "
                              f"{FIX}")
        self._data_bytes = data_bytes
        self.id = id
        self.max_stride = 0  # bytes from a sample's data to the next one's, at most (0: not known)
        self.reader: "ColumnReader | None" = None  # set for an index.bin: per-sample reads without the mapping
        # one flag per shard: check_shard looked at its entries (the columns are not checked whole at
        # open, which would cost every process about a second at 100 M samples); bad: what it found
        self.checked = np.zeros(len(self.shards), dtype=bool)
        self.bad: dict[int, entries.BadEntries] = {}

    def value(self, column: str, i: int) -> int:
        """Entry ``i`` of ``column`` ("offsets", "lengths", "labels", "checksums"), unchecked (:meth:`sample`
        checks): read from index.bin alone where the index is one, not through the mapping."""
        return self.reader.value(column, i) if self.reader is not None else int(getattr(self, column)[i])

    def values(self, column: str, first: int, end: int) -> np.ndarray:
        """Entries ``first..end-1`` of ``column``, unchecked (as :meth:`value`)."""
        if self.reader is not None:
            return self.reader.values(column, first, end)
        return np.asarray(getattr(self, column)[first:end])

    def __len__(self) -> int:
        return len(self.offsets)

    def checksum(self, i: int) -> int | None:
        """The checksum of sample ``i`` (what it covers: :attr:`coverage`), None when the index holds none."""
        return None if self.checksums is None else self.value("checksums", i)

    def shard_at(self, i: int) -> int:
        """The shard holding sample ``i``; IndexError when ``i`` is outside ``0..n-1``."""
        k = operator.index(i)
        n = len(self)
        if not 0 <= k < n:  # no wrap-around: -1 is no sample
            raise IndexError(f"sample {k} is outside 0..{n - 1}: the index holds {n} samples")
        return int(np.searchsorted(self.shards.first, k, side="right")) - 1

    @property
    def data_bytes(self) -> int:
        """Bytes of sample data (the shards less their tar headers and padding)."""
        if self._data_bytes is None:
            self._data_bytes = int(self.lengths.sum(dtype=np.int64))
        return self._data_bytes

    def sample(self, i: int) -> tuple[int, int, int, int]:
        """``(shard, offset, length, label)`` of sample ``i``.

        Raises:
            IndexError: ``i`` outside ``0..n-1``.
            CorruptEntryError: sample ``i``'s entry is corrupt (its shard is checked at first use;
                the shard's other samples still read).
        """
        s = self.shard_at(i)
        bad = self.bad_entries(s)
        if len(bad):
            why = bad.reason(i)
            if why is not None:
                raise CorruptEntryError(f"{self.shards.where or 'index'}: {entries.describe(self, i, why)}; the index "
                                        f"is corrupt: {FIX}", sample=i, shard=self.shards.name(s))
        return s, self.value("offsets", i), self.value("lengths", i), self.value("labels", i)

    def parts(self, first: int, end: int) -> list[tuple[int, int, int]]:
        """The byte ranges holding samples ``first..end-1``: ``(shard, start, stop)``, one per shard touched
        that holds a sample with a sound entry (bad entries are left out: nothing reads their bytes)."""
        if not 0 <= first < end <= len(self):
            raise IndexError(f"samples {first}..{end - 1} are outside 0..{len(self) - 1}: the index holds "
                             f"{len(self)} samples")
        out = []
        i = first
        while i < end:
            s = self.shard_at(i)
            bad = self.bad_entries(s)
            last = min(end, int(self.shards.first[s + 1])) - 1
            if not len(bad):
                out.append((s, self.value("offsets", i), self.value("offsets", last) + self.value("lengths", last)))
            else:  # the sound entries' span (an entry left to its checksum may lie out of order)
                good = ~bad.mask(i, last + 1)
                if good.any():
                    offsets = self.values("offsets", i, last + 1)[good]
                    ends = offsets + self.values("lengths", i, last + 1)[good].astype(np.int64)
                    out.append((s, int(offsets.min()), int(ends.max())))
            i = last + 1
        return out

    def bad_entries(self, s: int) -> entries.BadEntries:
        """Shard ``s``'s corrupt entries (checked at its first use, once per process: :mod:`.entries`)."""
        if not self.checked[s]:
            self.check_shard(s)
        return self.bad.get(s, entries.NONE)

    def check_shard(self, s: int) -> None:
        """Find shard ``s``'s corrupt entries (see :meth:`check`; overlaps only without checksums, which
        otherwise tell the wrong sample of the two) and log them once; :meth:`sample` refuses them."""
        first, end = int(self.shards.first[s]), int(self.shards.first[s + 1])
        bad = entries.find(self, first, end, overlaps=self.checksums is None, chunk=CHECK_CHUNK)
        if len(bad):
            self.bad[s] = bad
            i = int(bad.samples[0])
            log.warning("%s: %d sample(s) of shard %s have corrupt entries, refused (the first: %s); %s",
                        self.shards.where or "index", len(bad), self.shards.name(s),
                        entries.describe(self, i, int(bad.why[0])), FIX)
        self.checked[s] = True

    def check(self) -> None:
        """Check every entry: within its shard (offset >= 0, offset + length <= the shard's size), in
        byte order without overlapping the next sample of its shard, label within ``0..classes-1``
        (>= 0 when the index names no classes). Vectorised, :data:`CHECK_CHUNK` samples at a time.

        Raises:
            ConfigError: naming the index, the shard, the sample, the bad value and the fix.
        """
        bad = entries.find(self, 0, len(self), overlaps=True, chunk=CHECK_CHUNK, first_only=True)
        if len(bad):
            i = int(bad.samples[0])
            raise ConfigError(f"{self.shards.where or 'index'}: {entries.describe(self, i, int(bad.why[0]))}; "
                              f"the index is corrupt: {FIX}")
        self.checked[:] = True  # no entry of any shard is bad, overlaps included

    # -- version 1: index.json
    def to_json(self) -> bytes:
        """The index as ``index.json`` (version 1; held whole in each reading process: small data sets only)."""
        return json.dumps({
            "format": FORMAT, "version": VERSION, "num_samples": len(self), "classes": self.classes,
            "shards": [{"name": s.name, "size": s.size, "first": s.first, "count": s.count} for s in self.shards],
            "offsets": _encode(self.offsets, "<i8"), "lengths": _encode(self.lengths, "<u4"),
            "labels": _encode(self.labels, "<i4"),
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "ShardIndex":
        """Parse and check an ``index.json``; ConfigError naming ``where`` and the fix when it is not one."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{where} is not a {FORMAT} index ({exc}); {FIX}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ConfigError(f"{where} is not a {FORMAT} index; {FIX}")
        if doc.get("version") != VERSION:
            raise ConfigError(f"{where} is {FORMAT} version {doc.get('version')!r}; this release reads version "
                              f"{VERSION}: write the prefix again with this release's `hetero prepare`")
        try:
            n = int(doc["num_samples"])
            shards = [ShardInfo(str(s["name"]), int(s["size"]), int(s["first"]), int(s["count"]))
                      for s in doc["shards"]]
            classes = [str(c) for c in doc.get("classes", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: malformed index ({type(exc).__name__}: {exc}); {FIX}") from None
        try:
            table = ShardTable.of(shards)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}; {FIX}") from None
        table.where = where
        if int(table.first[-1]) != n:
            raise ConfigError(f"{where}: shards hold {int(table.first[-1])} samples, the index says {n}")
        index = cls(classes, table, _decode(doc["offsets"], n, "offsets", where),
                    _decode(doc["lengths"], n, "lengths", where), _decode(doc["labels"], n, "labels", where),
                    id="json-" + hashlib.sha256(data).hexdigest()[:24])
        index.check()
        return index


class ColumnReader:
    """Single entries of an index file's per-sample columns, read with ``pread``.

    A worker reads a few entries per sample, scattered over gigabytes of columns: reading them
    into the page cache (shared by the node) rather than mapping them keeps the process's
    resident memory flat however many samples it reads (a page the kernel maps on a fault can
    bring a whole large folio, megabytes, into the process's RSS).
    """

    def __init__(self, fd: int, columns: dict[str, tuple[int, str]]) -> None:
        import struct
        import weakref

        self.fd = fd
        codes = {"<i8": "<q", "<u4": "<I", "<i4": "<i"}  # checksums are <u4 too
        self.columns = {name: (at, struct.Struct(codes[dtype])) for name, (at, dtype) in columns.items()}
        self.dtypes = {name: np.dtype(dtype) for name, (_, dtype) in columns.items()}
        weakref.finalize(self, os.close, fd)

    def value(self, column: str, i: int) -> int:
        at, st = self.columns[column]
        raw = os.pread(self.fd, st.size, at + i * st.size)
        if len(raw) != st.size:
            raise ConfigError(f"index file ends before entry {i} of column {column}; the index is truncated: {FIX}")
        return st.unpack(raw)[0]

    def values(self, column: str, first: int, end: int) -> np.ndarray:
        """Entries ``first..end-1`` of ``column`` (read, not mapped: see the class)."""
        at, st = self.columns[column]
        want = (end - first) * st.size
        raw = os.pread(self.fd, want, at + first * st.size)
        if len(raw) != want:
            raise ConfigError(f"index file ends before entry {end - 1} of column {column}; the index is truncated: "
                              f"{FIX}")
        return np.frombuffer(raw, dtype=self.dtypes[column])


def _column(array, dtype: str) -> np.ndarray:
    array = np.asarray(array)
    return array if array.dtype == np.dtype(dtype) else array.astype(dtype)


def _encode(array: np.ndarray, dtype: str) -> dict:
    return {"dtype": dtype, "b64": base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode()}


def _decode(field: dict, n: int, name: str, where: str) -> np.ndarray:
    try:
        dtype = np.dtype(field["dtype"])
        if dtype.kind not in "iu":
            raise ValueError(f"dtype {dtype} is not an integer type")
        array = np.frombuffer(base64.b64decode(field["b64"], validate=True), dtype=dtype)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: column {name!r} is malformed ({exc}); {FIX}") from None
    if len(array) != n:
        raise ConfigError(f"{where}: column {name!r} has {len(array)} entries for {n} samples; {FIX}")
    return array


def padded(n: int) -> int:
    """Bytes a tar member's data takes, padded to the 512-byte tar block."""
    return -(-n // TAR_BLOCK) * TAR_BLOCK
