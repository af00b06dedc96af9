"""``index.bin``: a shard index as binary columns that every process of a node maps from one file.

Layout (little-endian)::

    0   8  magic  b"\\x89HSIDX\\r\\n"
    8   4  version (4; 2, 3 read)  12  4  header length H     16  4  CRC-32 of the header
    20  H  header: JSON (classes, counts, id, and per column: dtype, byte offset, entries, CRC-32)
    ...    columns, each at a 64-byte boundary:
           offsets <i8, lengths <u4, labels <i4, checksums <u4   (one entry per sample; checksums:
                                                                   CRC32C of the sample's bytes then its label,
                                                                   version 4; of its bytes alone, version 3;
                                                                   none in version 2)
           shard_first <i8 (shards + 1), shard_size <i8, name_end <i8   (one per shard)
           names (the shard names' UTF-8 bytes back to back)

Opening one (:func:`read_index`) reads the header and checks the per-shard columns: its cost and
the memory it takes grow with the number of shards, never with the number of samples, whose
columns stay in the page cache, shared by every process of the node, and are paged in as samples
are read. A shard's per-sample entries are checked when a process first uses the shard
(:meth:`~.format.ShardIndex.check_shard`: offsets and lengths within the shard, in byte order
without overlapping, labels within the classes; read with ``pread``, vectorised): checking all of
them at open would cost every process about 0.9 s at 100 M samples (``python -m
benchmarks.index_scale --work /tmp/index-scale --samples 100000000 --json '' --check``), a
shard's first use 0.1 ms. A corrupt entry refuses its own sample (:mod:`.entries`) naming the
file, shard, sample, value and fix. From S3 the file is fetched once per node into the node's
cache (ranged GETs in parallel, one process fetching while the others wait) and mapped from there.

:class:`IndexWriter` writes one shard at a time (the columns go to temporary files, never all in
memory), so an index of a billion samples is written in bounded memory; :func:`write_index`
stores an in-memory :class:`~.format.ShardIndex`.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import struct
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np

from ..errors import ConfigError
from ..storage import LocalStore, open_store
from ..storage.base import StoreError
from .format import FIX, FORMAT, INDEX_NAME, JSON_INDEX_NAME, ColumnReader, Coverage, ShardIndex, ShardTable, check_name

MAGIC = b"\x89HSIDX\r\n"
# 3 added the per-sample checksums, 4 put the label in them; a release reading only 2 and 3 refuses
# 4 by this number (it would take every label-covering checksum for damaged bytes)
VERSION = 4
READABLE = (2, 3, 4)
COVERAGE = {2: Coverage.NONE, 3: Coverage.BYTES, 4: Coverage.BYTES_LABEL}
PREFIX = struct.Struct("<8sIII")
ALIGN = 64
SAMPLE_COLUMNS = (("offsets", "<i8"), ("lengths", "<u4"), ("labels", "<i4"), ("checksums", "<u4"))
SHARD_COLUMNS = (("shard_first", "<i8"), ("shard_size", "<i8"), ("name_end", "<i8"), ("names", "|u1"))
FETCH_RANGE = 64 << 20  # bytes per GET when an index is fetched from S3
FETCH_READERS = 8
HEAD_READ = 2048  # the first GET of an S3 index: its header (a longer one takes a second GET)

__all__ = ["IndexWriter", "write_index", "read_index", "open_index_file", "INDEX_NAME", "JSON_INDEX_NAME"]


class IndexWriter:
    """Builds ``index.bin`` shard by shard in bounded memory.

    ``add_shard`` appends one shard's per-sample columns to temporary files under ``folder``;
    ``write_file`` (or ``store``) assembles the index. Use it as a context manager (the temporary
    files are removed on exit)::

        with IndexWriter(staging) as w:
            w.add_shard("part-0/shard-000000.tar", size, offsets, lengths, labels)
            w.store(store, classes)
    """

    def __init__(self, folder: str = "") -> None:
        self.dir = tempfile.mkdtemp(prefix=".index-", dir=folder or None)
        self._files = {name: open(os.path.join(self.dir, name), "wb") for name, _ in SAMPLE_COLUMNS}
        self._crc = {name: 0 for name, _ in SAMPLE_COLUMNS}
        self.first = [0]
        self.sizes: list[int] = []
        self.names: list[bytes] = []
        self.data_bytes = 0
        self.max_stride = 0
        self.checksummed: bool | None = None  # set by the first shard added

    def __enter__(self) -> "IndexWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return self.first[-1]

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def add_shard(self, name: str, size: int, offsets, lengths, labels, checksums=None) -> None:
        """Append shard ``name`` (``size`` bytes) holding the samples at ``offsets`` (data start),
        ``lengths``, ``labels`` and ``checksums`` (each sample's CRC32C over its bytes and then its
        label: :func:`.checksum.sample_crc`, :func:`.checksum.sample_crcs`), in sample order.
        ConfigError when a sample lies outside it. An index whose shards all come without checksums
        is written as version 2 (samples unchecked)."""
        check_name(name)
        if self.checksummed is None:
            self.checksummed = checksums is not None
        if self.checksummed != (checksums is not None):
            raise ConfigError(f"shard {name}: {'no ' if checksums is None else ''}checksums given, unlike the shards "
                              "before it; give every shard's checksums (or none)")
        columns = {"offsets": np.ascontiguousarray(offsets, dtype="<i8"),
                   "lengths": np.ascontiguousarray(lengths, dtype="<u4"),
                   "labels": np.ascontiguousarray(labels, dtype="<i4"),
                   "checksums": np.ascontiguousarray(np.zeros(len(offsets)) if checksums is None else checksums,
                                                     dtype="<u4")}
        n = len(columns["offsets"])
        if not len(columns["lengths"]) == len(columns["labels"]) == len(columns["checksums"]) == n:
            raise ConfigError(f"shard {name}: {n} offsets, {len(columns['lengths'])} lengths, "
                              f"{len(columns['labels'])} labels and {len(columns['checksums'])} checksums")
        if np.asarray(lengths).size and int(np.max(lengths)) >= 1 << 32:
            raise ConfigError(f"shard {name}: a sample of {int(np.max(lengths))} bytes; samples must be under 4 GiB")
        if n:
            ends = columns["offsets"] + columns["lengths"].astype(np.int64)
            if int(columns["offsets"].min()) < 0 or int(ends.max()) > size:
                raise ConfigError(f"shard {name}: a sample lies outside its {size} bytes")
            strides = np.diff(np.append(columns["offsets"], ends[-1]))
            if n > 1 and int(strides[:-1].min()) < 0:  # a block caches one byte range per shard: first to last
                raise ConfigError(f"shard {name}: samples must be given in the order of their bytes in the shard "
                                  "(offsets rising); sort them by offset")
            over = np.flatnonzero(ends[:-1] > columns["offsets"][1:])
            if len(over):  # a reader refuses such an index: refuse it before it is written
                j = int(over[0])
                raise ConfigError(f"shard {name}: sample {j} (bytes {int(columns['offsets'][j])}..{int(ends[j])}) "
                                  f"runs into sample {j + 1} (at byte {int(columns['offsets'][j + 1])}); give each "
                                  "sample's own bytes, without overlapping")
            self.max_stride = max(self.max_stride, int(np.max(np.maximum(strides, columns["lengths"]))))
            self.data_bytes += int(columns["lengths"].sum(dtype=np.int64))
        for key, array in columns.items():
            raw = array.tobytes()
            self._files[key].write(raw)
            self._crc[key] = zlib.crc32(raw, self._crc[key])
        self.first.append(self.first[-1] + n)
        self.sizes.append(int(size))
        self.names.append(name.encode())

    def add_index(self, index: ShardIndex, prefix: str = "", shards=None) -> None:
        """Append every shard of ``index`` (names prefixed with ``prefix``), one shard at a time. Its
        checksums are written to cover each sample's label: checksums of the bytes alone (version 3)
        are continued over the labels; for an index without checksums, ``shards`` (the Store holding
        its shards) is read to compute them, without it the index is written unchecked (version 2).
        The labels are taken as ``index`` holds them: check a read index first (:func:`verify`)."""
        from .checksum import sample_checksums, sample_crcs

        for k in range(len(index.shards)):
            a, b = int(index.shards.first[k]), int(index.shards.first[k + 1])
            name, labels = index.shards.name(k), index.labels[a:b]
            sums: np.ndarray | None  # None: the shard is written unchecked
            if index.coverage is Coverage.BYTES_LABEL:  # a covered index has its checksums column
                sums = cast(np.ndarray, index.checksums)[a:b]
            elif index.coverage is Coverage.BYTES:
                sums = sample_crcs(cast(np.ndarray, index.checksums)[a:b], labels)
            else:
                sums = None if shards is None else \
                    sample_crcs(sample_checksums(shards, name, index.offsets[a:b], index.lengths[a:b]), labels)
            self.add_shard(prefix + name, int(index.shards.sizes[k]), index.offsets[a:b],
                           index.lengths[a:b], labels, sums)

    def write_file(self, path: str, classes: list[str]) -> str:
        """Write the index to ``path`` (atomically: a temporary file renamed); its ``id``."""
        for f in self._files.values():
            f.flush()
        small = {"shard_first": np.array(self.first, dtype="<i8"), "shard_size": np.array(self.sizes, dtype="<i8"),
                 "name_end": np.cumsum([len(x) for x in self.names], dtype="<i8"),
                 "names": np.frombuffer(b"".join(self.names), dtype="|u1")}
        n = len(self)
        columns: dict[str, dict[str, Any]] = {}
        at = 0
        version = VERSION if self.checksummed or self.checksummed is None else 2
        for name, dtype in SAMPLE_COLUMNS + SHARD_COLUMNS:
            if name == "checksums" and version == 2:
                continue
            count = n if name in self._files else len(small[name])
            crc = self._crc[name] if name in self._files else zlib.crc32(small[name].tobytes())
            columns[name] = {"dtype": dtype, "at": at, "count": count, "crc32": crc}
            at = _aligned(at + count * np.dtype(dtype).itemsize)
        digest = hashlib.sha256(json.dumps([columns, classes]).encode()).hexdigest()[:24]
        header = {"format": FORMAT, "version": version, "id": digest, "num_samples": n, "num_shards": len(self.sizes),
                  "data_bytes": self.data_bytes, "max_stride": self.max_stride, "columns_bytes": at,
                  "classes": list(classes), "columns": columns}
        raw = json.dumps(header, separators=(",", ":")).encode()
        base = _aligned(PREFIX.size + len(raw))
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".index-", suffix=".part", dir=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(PREFIX.pack(MAGIC, version, len(raw), zlib.crc32(raw)) + raw)
                for name in columns:
                    out.seek(base + columns[name]["at"])
                    if name in self._files:
                        with open(os.path.join(self.dir, name), "rb") as src:
                            shutil.copyfileobj(src, out, 16 << 20)
                    else:
                        out.write(small[name].tobytes())
                out.truncate(base + at)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return digest

    def store(self, store, classes: list[str], key: str = INDEX_NAME) -> str:
        """Write the index as ``key`` of ``store`` (a folder or an S3 prefix: written atomically); its ``id``."""
        path = os.path.join(self.dir, "index.bin")
        digest = self.write_file(path, classes)
        store.write_file(key, path)
        return digest


def write_index(store, index: ShardIndex, key: str = INDEX_NAME, shards=None) -> str:
    """Store ``index`` as ``index.bin`` (``key``) of ``store`` (a Store, or a folder or S3 location); its id.
    ``shards``: the Store holding the shards, read for the checksums when ``index`` holds none (checksums
    of the bytes alone are continued over the labels without reading the shards)."""
    if isinstance(store, str):
        store = open_store(store, what="dest", create=True)
    with IndexWriter(getattr(store, "root", "") if isinstance(store, LocalStore) else "") as w:
        w.add_index(index, shards=shards)
        return w.store(store, index.classes, key)


def read_index(location, *, cache_dir: str = "", request_timeout_s: float = 60.0) -> ShardIndex:
    """The index of ``location`` (a folder, an ``s3://`` prefix or a Store): ``index.bin``, else ``index.json``.

    A folder's ``index.bin`` is mapped in place; an S3 one is fetched once per node into
    ``cache_dir`` (default ``HETERO_CACHE_DIR`` or the temporary folder) and mapped from there.

    Raises:
        ConfigError: no index, or one that is truncated or corrupt (naming it and the fix).
    """
    store = location if not isinstance(location, str) else \
        open_store(location, what="shards", request_timeout_s=request_timeout_s)
    base = store.url.rstrip("/")
    try:
        if isinstance(store, LocalStore):
            path = store.key_url(INDEX_NAME)
            if os.path.exists(path):
                return open_index_file(path, f"{base}/{INDEX_NAME}")
        elif store.exists(INDEX_NAME):
            return _fetched(store, cache_dir, f"{base}/{INDEX_NAME}")
        if store.exists(JSON_INDEX_NAME):
            return ShardIndex.from_json(store.read(JSON_INDEX_NAME), f"{base}/{JSON_INDEX_NAME}")
        store.check(INDEX_NAME)  # ConfigError naming the location and the fix
    except StoreError as exc:  # at start: a set-up problem (access, endpoint, a missing object)
        raise ConfigError(str(exc)) from exc
    raise ConfigError(f"{base}/{INDEX_NAME} cannot be read; {FIX}")


def open_index_file(path: str, where: str = "") -> ShardIndex:
    """Map the ``index.bin`` at ``path``; ConfigError naming ``where`` when it is not a whole, valid index."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _open_fd(fd, where or path)
    finally:
        os.close(fd)


def _open_fd(fd: int, where: str) -> ShardIndex:
    size = os.fstat(fd).st_size
    head = os.pread(fd, PREFIX.size, 0)
    header = _header(head, lambda n: os.pread(fd, n, PREFIX.size), size, where)
    index = _index(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), header, where)
    base, cols = header["data_start"], header["columns"]
    index.reader = ColumnReader(os.dup(fd), {name: (base + int(cols[name]["at"]), dtype)
                                             for name, dtype in SAMPLE_COLUMNS if name in cols})
    return index


def _header(head: bytes, more, size: int, where: str) -> dict:
    if size == 0:  # an upload or copy that stopped before its first byte, not some other format
        raise ConfigError(f"{where} is empty (0 bytes): its writing stopped before it began or it was "
                          f"truncated; {FIX}")
    if len(head) < PREFIX.size or head[:8] != MAGIC:
        raise ConfigError(f"{where} is not a {FORMAT} index (no index.bin signature); {FIX}")
    _, version, length, crc = PREFIX.unpack(head)
    if version not in READABLE:
        raise ConfigError(f"{where} is {FORMAT} index.bin version {version}; this release reads versions "
                          f"{', '.join(map(str, READABLE))}: write it again with this release's `hetero prepare` or "
                          "`hetero index`, or read it with the release that wrote it")
    if length > size - PREFIX.size:  # read nothing a damaged length announces past the file's end
        raise ConfigError(f"{where}: the index header is truncated or corrupt (its length {length} runs past the "
                          f"{size}-byte file); {FIX}")
    raw = more(length)
    if len(raw) != length or zlib.crc32(raw) != crc:
        raise ConfigError(f"{where}: the index header is truncated or corrupt (checksum mismatch); {FIX}")
    try:
        header = json.loads(raw)
        header["data_start"] = _aligned(PREFIX.size + length)
        header["version"] = version  # the prefix's, which READABLE vetted
        need = header["data_start"] + int(header["columns_bytes"])
        int(header["num_samples"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: malformed index header ({exc}); {FIX}") from None
    if size != need:
        raise ConfigError(f"{where} is {size} bytes, its header says {need}: the file is truncated or was "
                          f"overwritten while copied; {FIX}")
    return header


def _index(buf, header: dict, where: str) -> ShardIndex:
    try:
        base, n, cols = int(header["data_start"]), int(header["num_samples"]), header["columns"]
        arrays = {}
        for name, dtype in SAMPLE_COLUMNS + SHARD_COLUMNS:
            if name == "checksums" and name not in cols:  # version 2
                continue
            c = cols[name]
            if c["dtype"] != dtype:
                raise ValueError(f"column {name} is {c['dtype']}, expected {dtype}")
            arrays[name] = np.frombuffer(buf, dtype=dtype, count=int(c["count"]), offset=base + int(c["at"]))
        classes = [str(c) for c in header.get("classes", [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: malformed index ({type(exc).__name__}: {exc}); {FIX}") from None
    first, sizes, ends, names = (arrays[k] for k in ("shard_first", "shard_size", "name_end", "names"))
    for name in ("shard_first", "shard_size", "name_end", "names"):
        if zlib.crc32(arrays[name]) != int(cols[name]["crc32"]):  # type: ignore[arg-type]  # numpy's stubs: a buffer
            raise ConfigError(f"{where}: the shard table ({name}) is corrupt (checksum mismatch); {FIX}")
    s = len(sizes)
    if (len(first) != s + 1 or len(ends) != s or int(first[0]) != 0 or int(first[-1]) != n
            or bool(np.any(np.diff(first) < 0)) or bool(np.any(sizes < 0)) or (s and int(ends[-1]) != len(names))
            or bool(np.any(np.diff(ends) <= 0)) or (s and int(ends[0]) <= 0)
            or any(len(arrays[k]) != n for k, _ in SAMPLE_COLUMNS if k in arrays)):
        raise ConfigError(f"{where}: the shard table does not add up to {n} samples; {FIX}")
    # the shard table is searched for every sample: a copy (bytes per shard, not per sample)
    table = ShardTable(first.copy(), sizes.copy(), ends, names, where)
    index = ShardIndex(classes, table, arrays["offsets"], arrays["lengths"], arrays["labels"],
                       data_bytes=int(header.get("data_bytes", 0)), id=str(header.get("id", "")),
                       checksums=arrays.get("checksums"), coverage=COVERAGE[header["version"]])
    index.max_stride = int(header.get("max_stride", 0))
    return index


def verify(index_path: str, where: str = "") -> ShardIndex:
    """Open ``index_path`` and check every column's checksum and every entry (``ShardIndex.check``)
    (reads the whole file: for converters and tests, not readers)."""
    index = open_index_file(index_path, where)
    with open(index_path, "rb") as f:
        head = f.read(PREFIX.size)
        header = json.loads(f.read(PREFIX.unpack(head)[2]))
    for name, _ in SAMPLE_COLUMNS:
        if name in header["columns"] and zlib.crc32(getattr(index, name)) != int(header["columns"][name]["crc32"]):
            raise ConfigError(f"{where or index_path}: column {name} is corrupt (checksum mismatch); {FIX}")
    index.check()
    return index


def _fetched(store, cache_dir: str, where: str) -> ShardIndex:
    """Fetch the S3 ``index.bin`` into the node's cache once (keyed by its header's id) and map it."""
    from .cache import BlockCache, default_dir

    size = store.check(INDEX_NAME)
    head = store.read(INDEX_NAME, 0, min(size, HEAD_READ)) if size else b""

    def more(k: int) -> bytes:
        have = head[PREFIX.size:PREFIX.size + k]
        if len(have) < k and PREFIX.size + k <= size:
            have += store.read(INDEX_NAME, len(head), PREFIX.size + k)
        return have

    header = _header(head[:PREFIX.size], more, size, where)
    name = f"index-{hashlib.sha256((store.url + chr(0) + str(header.get('id'))).encode()).hexdigest()[:24]}.bin"
    files = BlockCache(os.path.join(cache_dir or default_dir(), "indexes"), max_bytes=4 * size + (64 << 20))

    def fill(out: int) -> None:
        os.ftruncate(out, size)
        with ThreadPoolExecutor(FETCH_READERS, thread_name_prefix="index-fetch") as pool:
            list(pool.map(lambda a: os.pwrite(out, store.read(INDEX_NAME, a, min(size, a + FETCH_RANGE)), a),
                          range(0, size, FETCH_RANGE)))

    fd = files.open(name, size, fill)
    try:
        return _open_fd(fd, where)
    finally:
        os.close(fd)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
