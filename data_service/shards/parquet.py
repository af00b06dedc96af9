"""``ParquetDataset``: a Parquet data set read in place (a file, or a folder or ``s3://`` prefix of them).

The layout Hugging Face ``datasets`` exports (and anything pyarrow writes): a column of image
bytes (``binary``, or a struct with a ``bytes`` field such as ``datasets.Image``'s ``{bytes,
path}``) and a column of integer labels. Samples are the rows, file after file in name order, each
file's row groups in order. Class names come from the ``datasets`` metadata of the label column
(its ``ClassLabel`` names) when it is there, else ``0..max`` from the row groups' statistics.

Sample ``i`` is ``(bytes, label)`` as from :class:`~.dataset.ShardDataset`, and like it a
``ParquetDataset`` is a :class:`~data_service.pipeline.BlockPrefetcher`. The unit read is a row
group: the byte ranges of its two column chunks (nothing else of the file), read once per node,
decoded by pyarrow and kept in the node's cache (:class:`~.cache.BlockCache`, one file per row
group: offsets, labels, then the images back to back) where every worker process of the node
reads single samples. Opening reads each file's footer once per node (also kept in the cache):
what a process holds grows with the number of row groups, never with the number of rows.

A shuffle block (``block_samples`` rows) touches the row groups holding its rows: pick
``shuffle_block`` as a multiple of the row group size so that blocks and row groups line up and
no two data nodes read the same row group (a row group two blocks share is read by each node
serving one of them, once per node).

A missing column, or one of another type, is a ConfigError at start naming the file and the
columns there. A row group whose columns do not decode is a :class:`ParquetReadError` naming the
file and rows, or with ``on_corrupt="skip"`` each of its rows is skipped
(:class:`~data_service.SkipSample`, counted in the data server's ``samples_skipped``).
"""
from __future__ import annotations

import collections
import fcntl
import hashlib
import io
import json
import logging
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import ConfigError, DataServiceError
from ..filecache import flock
from ..storage import LocalStore, open_store
from .cache import BlockCache, default_dir

log = logging.getLogger(__name__)

OPEN_BLOCKS = 32
BLOCK = b"HPQBLK1\n"  # a decoded row group: n, offsets (n + 1), labels (n), then the images
FAILED = b"HPQFAIL\n"  # a row group that does not decode: the message follows
HEAD = struct.Struct("<8sQ")


class ParquetReadError(DataServiceError):
    """A row group's columns do not decode (a corrupt or truncated file)."""


class ParquetDataset:
    """Map-style: sample ``i`` is ``(image bytes, int label)``, from Parquet files read in place.

    Args:
        location: a ``.parquet`` file, or a folder or ``s3://bucket/prefix`` of them (subfolders included).
        block_samples: rows per shuffle block (the pipeline's ``shuffle_block``).
        image_column, label_column: the columns read.
        on_corrupt: ``"fail"`` or ``"skip"`` for a row group that does not decode.
        cache_dir, cache_bytes, request_timeout_s, readers: as :class:`~.dataset.ShardDataset`.

    Raises:
        ConfigError: no Parquet files, a missing or mistyped column, a file that is not Parquet.
    """

    def __init__(self, location: str, *, block_samples: int = 1024, image_column: str = "image",
                 label_column: str = "label", on_corrupt: str = "fail", cache_dir: str = "", cache_bytes: int = 0,
                 request_timeout_s: float = 60.0, readers: int = 8) -> None:
        if isinstance(block_samples, bool) or not isinstance(block_samples, int) or block_samples < 1:
            raise ConfigError(f"block_samples={block_samples!r} must be an integer >= 1")
        if on_corrupt not in ("fail", "skip"):
            raise ConfigError(f"on_corrupt={on_corrupt!r} must be 'fail' or 'skip'")
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise ConfigError("pipeline.parquet needs pyarrow on the data nodes: pip install "
                              "'hetero-data-service[parquet]'") from None
        self.location, self.block_samples, self.on_corrupt = location, block_samples, on_corrupt
        self.image_column, self.label_column = image_column, label_column
        single = location.endswith(".parquet")
        prefix, _, base = location.rstrip("/").rpartition("/") if single else (location, "", "")
        self.store = open_store(prefix or ".", what="parquet", request_timeout_s=request_timeout_s)
        self.local = isinstance(self.store, LocalStore)
        self.files = [(base, self.store.check(base))] if single else _list(self.store)
        listing = json.dumps([location, self.files, image_column, label_column]).encode()
        digest = hashlib.sha256(listing).hexdigest()[:16]
        self.cache = BlockCache(os.path.join(cache_dir or default_dir(), f"parquet-{digest}"), cache_bytes)
        self._lock = threading.Lock()
        self._read_footers(readers)
        self._open: collections.OrderedDict[int, tuple] = collections.OrderedDict()
        self._prefetcher: ThreadPoolExecutor | None = None
        self._prefetched: set[int] = set()

    # -- opening: one footer per file
    def _read_footers(self, readers: int) -> None:
        firsts, files, groups, spans, stats_max = [0], [], [], [], -1
        names = None
        with ThreadPoolExecutor(readers, thread_name_prefix="parquet-footer") as pool:
            metas = list(pool.map(self._metadata, range(len(self.files))))
        for k, meta in enumerate(metas):
            where = self._url(k)
            schema = meta.schema.to_arrow_schema()
            image, label = self._columns(schema, where)
            paths = [image, label]
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                chunks = [rg.column(j) for j in range(rg.num_columns) if rg.column(j).path_in_schema in paths]
                if len(chunks) != 2:
                    raise ConfigError(f"{where}: row group {g} lacks column {image!r} or {label!r}")
                starts = [c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else
                          c.data_page_offset for c in chunks]
                stops = [s + c.total_compressed_size for s, c in zip(starts, chunks)]
                for c in chunks:
                    if c.path_in_schema == label and c.is_stats_set and c.statistics.has_min_max:
                        stats_max = max(stats_max, int(c.statistics.max))
                firsts.append(firsts[-1] + rg.num_rows)
                files.append(k)
                groups.append(g)
                spans.append((min(starts), max(stops)))
            if names is None:
                names = _class_names(schema, self.label_column)
        if firsts[-1] == 0:
            raise ConfigError(f"{self.location}: the Parquet files hold no rows")
        self.first = np.array(firsts, dtype=np.int64)
        self.group_file = np.array(files, dtype=np.int32)
        self.group_index = np.array(groups, dtype=np.int32)
        self.spans = np.array(spans, dtype=np.int64).reshape(-1, 2)
        self.classes = names if names is not None else [str(c) for c in range(stats_max + 1)]

    def _columns(self, schema, where: str) -> tuple[str, str]:
        """The leaf paths of the image and label columns; ConfigError naming what the file has."""
        import pyarrow as pa

        have = ", ".join(f"{f.name} ({f.type})" for f in schema)
        if self.image_column not in schema.names or self.label_column not in schema.names:
            missing = [c for c in (self.image_column, self.label_column) if c not in schema.names]
            raise ConfigError(f"{where} has no column {', '.join(map(repr, missing))} (it has {have}); pass "
                              "pipeline.image_column= and pipeline.label_column=")
        image = schema.field(self.image_column).type
        path = self.image_column
        if pa.types.is_struct(image) and image.get_field_index("bytes") >= 0:
            image, path = image.field("bytes").type, f"{self.image_column}.bytes"
        if not (pa.types.is_binary(image) or pa.types.is_large_binary(image)):
            raise ConfigError(f"{where}: column {self.image_column!r} is {schema.field(self.image_column).type}, not "
                              "image bytes (binary, or a struct with a binary 'bytes' field); name the image "
                              f"column with pipeline.image_column= (the file has {have})")
        if not pa.types.is_integer(schema.field(self.label_column).type):
            raise ConfigError(f"{where}: column {self.label_column!r} is {schema.field(self.label_column).type}, "
                              "not integer labels; name the label column with pipeline.label_column= (the file "
                              f"has {have})")
        return path, self.label_column

    def _metadata(self, k: int):
        """File ``k``'s footer, fetched once per node into the cache."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_metadata(pa.py_buffer(b"PAR1" + self._footer(k)[1]))  # the footer alone parses
        except Exception as exc:  # pyarrow's own errors: a file that is not whole
            raise ConfigError(f"{self._url(k)}: its Parquet footer cannot be read ({exc}); replace the file") from None

    def _footer(self, k: int) -> tuple[int, bytes]:
        """``(where, bytes)``: the end of file ``k`` holding its footer, from the node cache."""
        raw = self._cached(f"footer-{k:06d}", lambda: self._tail(k))
        return int.from_bytes(raw[:8], "little"), raw[8:]

    def _tail(self, k: int) -> list[bytes]:
        """File ``k``'s footer: its last 8 bytes, then exactly the footer they give the length of (no byte
        of the row groups: those are read once, by the row group that holds them)."""
        name, size = self.files[k]
        end = self.store.read(name, size - 8, size) if size >= 12 else b""
        if end[-4:] != b"PAR1":
            raise ConfigError(f"{self._url(k)} is not a Parquet file (no PAR1 at its end); remove it from the "
                              "location or name a single file")
        need = int.from_bytes(end[:4], "little") + 8
        if need + 4 > size:
            raise ConfigError(f"{self._url(k)}: its footer claims {need} bytes of a {size}-byte file; replace it")
        return [(size - need).to_bytes(8, "little"), self.store.read(name, size - need, size - 8), end]

    # -- samples
    def __len__(self) -> int:
        return int(self.first[-1])

    def group_of(self, i: int) -> int:
        return int(np.searchsorted(self.first, i, side="right")) - 1

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} is outside 0..{len(self) - 1}")
        g = self.group_of(i)
        fd, offsets, labels, failed = self._group(g)
        if failed:
            if self.on_corrupt == "skip":
                from ..pipeline import SkipSample

                raise SkipSample(f"sample {i}: {failed}")
            raise ParquetReadError(f"{failed}; replace the file, or pass pipeline.on_corrupt=skip to drop its rows "
                                   "(counted in the data server's samples_skipped)")
        row = i - int(self.first[g])
        start, stop = int(offsets[row]), int(offsets[row + 1])
        base = HEAD.size + 16 * len(labels) + 8
        data = os.pread(fd, stop - start, base + start)
        if len(data) != stop - start:
            raise OSError(f"cached row group {g} of {self.location} is short")
        return data, int(labels[row])

    def _group(self, g: int):
        hit = self._open.get(g)
        if hit is not None:
            self._open.move_to_end(g)
            return hit
        fd = self._decoded(g)
        head = os.pread(fd, HEAD.size, 0)
        magic, n = HEAD.unpack(head)
        if magic == FAILED:
            entry = (fd, None, None, os.pread(fd, n, HEAD.size).decode("utf-8", "replace"))
        else:
            meta = np.frombuffer(os.pread(fd, 16 * n + 8, HEAD.size), dtype="<i8")
            entry = (fd, meta[:n + 1], meta[n + 1:], "")
        self._open[g] = entry
        while len(self._open) > OPEN_BLOCKS:
            os.close(self._open.popitem(last=False)[1][0])
        return entry

    def _decoded(self, g: int) -> int:
        return self._cached_fd(f"rg-{g:08d}.blk", lambda: self._decode(g))

    def _decode(self, g: int) -> list[bytes]:
        """Row group ``g`` read (its two column chunks' span, once) and decoded into a cache entry."""
        import pyarrow.parquet as pq

        k, index = int(self.group_file[g]), int(self.group_index[g])
        name, size = self.files[k]
        start, stop = (int(x) for x in self.spans[g])
        where = f"{self._url(k)} row group {index} (samples {int(self.first[g])}..{int(self.first[g + 1]) - 1})"
        raw = self.store.read(name, start, stop)
        try:
            meta = self._metadata(k)
            file = pq.ParquetFile(_Window(size, {start: raw}), metadata=meta)
            image, label = self._columns(meta.schema.to_arrow_schema(), self._url(k))
            table = file.read_row_group(index, columns=[image, label], use_threads=False)
            images = table.column(0)
            if images.type.num_fields:  # the struct: its bytes field
                images = images.combine_chunks().field("bytes")
            values = images.to_pylist()
            labels = table.column(1).to_numpy(zero_copy_only=False)
        except Exception as exc:  # pyarrow's errors for bytes that do not decode
            reason = " ".join(str(exc).split()) or type(exc).__name__
            message = f"{where}: column {self.image_column!r} or {self.label_column!r} cannot be read ({reason})"
            return [HEAD.pack(FAILED, len(message.encode())), message.encode()]
        lengths = np.array([len(v) if v is not None else 0 for v in values], dtype="<i8")
        offsets = np.zeros(len(values) + 1, dtype="<i8")
        np.cumsum(lengths, out=offsets[1:])
        labels = np.where(np.isnan(labels), -1, labels).astype("<i8") if labels.dtype.kind == "f" else \
            labels.astype("<i8")
        return [HEAD.pack(BLOCK, len(values)), offsets.tobytes(), labels.tobytes(), b"".join(v or b"" for v in values)]

    # -- the node cache: one process fills an entry while the others wait
    def _cached_fd(self, name: str, make) -> int:
        files = self.cache.files
        fd = files.open(name)
        if fd is not None:
            return fd
        lock = os.open(files.path(name) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            flock(lock, fcntl.LOCK_EX, files.wait_s,
                  lambda: f"{name}: another process of this host has been reading it for over {files.wait_s:.0f}s")
            fd = files.open(name)
            if fd is None:
                chunks = make()
                size = sum(len(c) for c in chunks)
                if size > self.cache.max_bytes or not files.put(name, chunks) or (fd := files.open(name)) is None:
                    raise ConfigError(f"{self.location}: a decoded row group of {size} bytes does not fit "
                                      f"cache_bytes={self.cache.max_bytes} ({self.cache.dir}); raise cache_bytes or "
                                      "free disk space there")
            return fd
        finally:
            os.close(lock)

    def _cached(self, name: str, make) -> bytes:
        fd = self._cached_fd(name, make)
        try:
            return os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)

    # -- blocks
    def block_groups(self, block: int) -> range:
        """The row groups holding block ``block``'s rows."""
        first = block * self.block_samples
        last = min(first + self.block_samples, len(self)) - 1
        return range(self.group_of(first), self.group_of(last) + 1)

    def prefetch_block(self, block: int) -> None:
        """Start reading block ``block``'s row groups into the node's cache; returns at once."""
        with self._lock:
            todo = [g for g in self.block_groups(block) if g not in self._prefetched
                    and not self.cache.cached(f"rg-{g:08d}.blk")]
            self._prefetched.update(todo)
            if todo and self._prefetcher is None:
                self._prefetcher = ThreadPoolExecutor(2, thread_name_prefix="parquet-prefetch")
        for g in todo:
            self._prefetcher.submit(self._prefetch_one, g)

    def _prefetch_one(self, g: int) -> None:
        try:
            os.close(self._decoded(g))
        except Exception as exc:  # the worker that needs the row group reads it again and reports the error
            log.warning("prefetch of row group %d of %s failed: %s", g, self.location, exc)
        finally:
            with self._lock:
                self._prefetched.discard(g)

    def _url(self, k: int) -> str:
        return f"{self.store.url.rstrip('/')}/{self.files[k][0]}"


class _Window(io.RawIOBase):
    """A file of ``size`` bytes of which only some stretches are held: pyarrow reads nothing else."""

    def __init__(self, size: int, held: dict[int, bytes]) -> None:
        self.size, self.held, self.pos = size, held, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.size + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), self.size - self.pos)
        for at, data in self.held.items():
            if at <= self.pos and self.pos + n <= at + len(data):
                buf[:n] = data[self.pos - at:self.pos - at + n]
                self.pos += n
                return n
        raise OSError(f"bytes {self.pos}..{self.pos + n} of the Parquet file were not read (outside the row group)")


def _list(store) -> list[tuple[str, int]]:
    from .wds_index import list_objects

    return list_objects(store, ".parquet")


def _class_names(schema, label: str) -> list[str] | None:
    """The ``ClassLabel`` names Hugging Face ``datasets`` keeps in the schema's metadata, if any."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        feature = json.loads(raw)["info"]["features"][label]
        names = feature.get("names") if isinstance(feature, dict) else None
        return [str(n) for n in names] if names else None
    except (TypeError, ValueError, KeyError):
        return None
