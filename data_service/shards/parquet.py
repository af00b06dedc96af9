"""``ParquetDataset``: a Parquet data set read in place (a file, or a folder or ``s3://`` prefix of them).

The layout Hugging Face ``datasets`` exports (and anything pyarrow writes): a column of image
bytes (``binary``, or a struct with a ``bytes`` field such as ``datasets.Image``'s ``{bytes,
path}``) and a column of integer labels. Samples are the rows, file after file in name order, each
file's row groups in order. Class names come from the ``datasets`` metadata of the label column
(its ``ClassLabel`` names) when it is there, else ``0..max`` from the row groups' statistics.

Sample ``i`` is ``(bytes, label)`` as from :class:`~.dataset.ShardDataset`, and like it a
``ParquetDataset`` is a :class:`~data_service.contract.pipeline.BlockPrefetcher`. The unit read is a row
group: the byte ranges of its two column chunks (nothing else of the file), read once per node,
decoded by pyarrow and kept in the node's cache (:class:`~.cache.BlockCache`, one file per row
group: :func:`.parquet_meta.entry`) where every worker process of the node reads single samples.
Opening reads each file's footer once per node (also kept in the cache) and makes the table of row
groups once per node; every other process of the node LISTs the location and loads that table:
what it holds grows with the number of row groups, never with the number of rows.

A shuffle block (``block_samples`` rows) touches the row groups holding its rows: pick
``shuffle_block`` as a multiple of the row group size so that blocks and row groups line up and
no two data nodes read the same row group (a row group two blocks share is read by each node
serving one of them, once per node).

A missing column, or one of another type, is a ConfigError at start naming the file and the
columns there (:mod:`.parquet_meta`). A row group whose columns do not decode is a
:class:`ParquetReadError` naming the file and rows, or with ``on_corrupt="skip"`` each of its rows
is skipped (:class:`~data_service.SkipSample`, counted in the data server's ``samples_skipped``);
so is a row without a label. The failure is kept in the cache like a decoded row group: the bytes
are read once either way.

Page CRCs (pyarrow's ``write_page_checksum=True``) are verified as pages decode: a mismatch reads
the row group once more from the source before it counts as not decoding. Files without them
(pyarrow's default) are checked by the row checksums ``hetero index`` writes (:mod:`.parquet_sums`):
each decoded row is compared with its checksum, a mismatch reads the row group once more from the
source, and a row still unlike its checksum fails (naming the file and row) or with
``on_corrupt="skip"`` is skipped alone. A file with neither is read unchecked, said once per file
at start, or with ``unchecked="refuse"`` refused at start. A decoded row's CRC32C (image bytes and
label) is checked on every read from the cache: a bad cached copy is dropped and decoded again.
Every re-read counts in the data server's ``samples_reread``.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..contract.on_corrupt import OnCorrupt
from ..contract.pipeline import count_reread
from ..errors import ConfigError, DataServiceError
from ..storage import open_store
from . import parquet_meta as pm
from . import parquet_sums as ps
from .cache import BlockCache, CacheReader, check_reads, default_dir

log = logging.getLogger(__name__)


class ParquetReadError(DataServiceError):
    """A row group's columns do not decode (a corrupt or truncated file)."""


class ParquetDataset:
    """Map-style: sample ``i`` is ``(image bytes, int label)``, from Parquet files read in place.

    Args:
        location: a ``.parquet`` file, or a folder or ``s3://bucket/prefix`` of them (subfolders included).
        block_samples: rows per shuffle block (the pipeline's ``shuffle_block``).
        image_column, label_column: the columns read.
        on_corrupt: ``"fail"`` or ``"skip"`` for a row group that does not decode, or a row without a label.
        cache_dir, cache_bytes, request_timeout_s: as :class:`~.dataset.ShardDataset`.
        readers: parallel ranged reads: footers when opening, ranges of a large row group.
        range_bytes: the most one read asks for; a larger row group is read in ranges of this size.
        index: the folder or ``s3://`` prefix holding the row checksums (``hetero index LOCATION --to
            INDEX``); "" = beside the files.
        unchecked: a file with neither page CRCs nor row checksums: ``"warn"`` reads it, saying so
            once per file; ``"refuse"`` is a ConfigError naming it and the fix.

    Raises:
        ConfigError: no Parquet files, a missing or mistyped column, a file that is not Parquet, a
            damaged row-checksum file, an unchecked file with ``unchecked="refuse"``.
    """

    def __init__(self, location: str, *, block_samples: int = 1024, image_column: str = "image",
                 label_column: str = "label", on_corrupt: OnCorrupt | str = OnCorrupt.FAIL, cache_dir: str = "",
                 cache_bytes: int = 0, request_timeout_s: float = 60.0, readers: int = 8, range_bytes: int = 16 << 20, index: str = "",
                 unchecked: str = "warn") -> None:
        check_reads(block_samples, range_bytes, readers)
        on_corrupt = OnCorrupt.parse(on_corrupt)
        if unchecked not in ps.UNCHECKED:
            raise ConfigError(f"unchecked={unchecked!r} must be " +
                              " or ".join(f"{k!r} ({why})" for k, why in ps.UNCHECKED.items()))
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise ConfigError("pipeline.parquet needs pyarrow on the data nodes: pip install "
                              "'hetero-data-service[parquet]'") from None
        self.location, self.block_samples, self.on_corrupt = location, block_samples, on_corrupt
        self.readers, self.range_bytes = readers, range_bytes
        self.image_column, self.label_column = image_column, label_column
        folder, sums_folder, self.sums_key = ps.place(location, index)
        self.store = open_store(folder, what="parquet", request_timeout_s=request_timeout_s)
        listed = ps.listed(self.store, location, versions=True)
        self.files = [(name, size) for name, size, _ in listed]
        self.sums_store = open_store(index, what="parquet index", request_timeout_s=request_timeout_s) if index \
            else self.store
        self.sums = ps.identity(self.sums_store, self.sums_key)  # None: no row checksums
        # the cache is keyed by what was listed: a file (or its checksums) written again is read again
        listing = json.dumps([location, listed, image_column, label_column, sums_folder, self.sums]).encode()
        self.cache = BlockCache(os.path.join(cache_dir or default_dir(),
                                             f"parquet-{hashlib.sha256(listing).hexdigest()[:16]}"), cache_bytes)
        self._reads = CacheReader(self.cache, lambda g: f"rg-{g:08d}.blk", self.store, readers, range_bytes,
                                  "parquet row group")
        # file k's footer parsed, the last few kept per process (thread-safe: the prefetch threads decode too)
        self._metadata = functools.lru_cache(maxsize=4)(lambda k: pm.parse_footer(self._footer(k), self._url(k)))
        table = np.load(io.BytesIO(self.cache.made_bytes("row-groups.npz", lambda: [self._table(readers)],
                                                         "the row group table")))
        self.first, self.group_file, self.group_index, self.spans, self.sums_at, self.checks = (
            table[k] for k in ("first", "group_file", "group_index", "spans", "sums_at", "checks"))
        self.classes = [str(c) for c in json.loads(bytes(table["classes"]))]
        notes = json.loads(bytes(table["notes"]))
        ps.say_unchecked([(self._url(k), notes[k]) for k in range(len(self.files)) if self.checks[k] == ps.Check.NONE],
                         location, index, unchecked)

    def _table(self, readers: int) -> bytes:
        """The row groups of every file as columns (first row, file, index in the file, byte span, where
        its row checksums are), what checks each file, and the classes: made once per node from the
        footers (and the first page header of a file without row checksums), then loaded by every process."""
        sidecar = ps.Sidecar.read(self.sums_store, self.sums_key) if self.sums is not None else None
        with ThreadPoolExecutor(readers, thread_name_prefix="parquet-footer") as pool:
            found = list(pool.map(lambda k: self._checks(k, sidecar), range(len(self.files))))
        return pm.group_table([meta for meta, _ in found], self.image_column, self.label_column,
                              [self._url(k) for k in range(len(found))], self.location, [c for _, c in found])

    def _checks(self, k: int, sidecar: "ps.Sidecar | None") -> tuple:
        """(file ``k``'s footer parsed, (what checks it, where its row checksums start or -1, why unchecked))."""
        footer = self._footer(k)
        meta = pm.parse_footer(footer, self._url(k))
        return meta, ps.file_check(self.store, *self.files[k], footer, meta, (self.image_column, self.label_column),
                                   self._url(k), sidecar, self.sums_store.key_url(self.sums_key))

    def _footer(self, k: int) -> bytes:
        """File ``k``'s footer, read once per node into the cache."""
        name, size = self.files[k]
        return self.cache.made_bytes(f"footer-{k:06d}", lambda: [pm.read_footer(self.store, name, size, self._url(k))],
                                     "a Parquet footer")

    # -- samples
    def __len__(self) -> int:
        return int(self.first[-1])

    def group_of(self, i: int) -> int:
        """The row group holding sample ``i``."""
        return int(np.searchsorted(self.first, i, side="right")) - 1

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} is outside 0..{len(self) - 1}")
        g = self.group_of(i)
        failed = self._group(g)[3]
        row = i - int(self.first[g])
        if not failed:
            data, label = self._checked(i, g, row)
            if label >= 0:
                return data, label
            failed = f"{self._where(g)}: row {row} has no label" if label == pm.NO_LABEL else \
                f"{self._where(g)}: row {row} differs from its checksum (written by `hetero index`), read twice from " \
                "the source: the file was damaged after it was indexed (or written again: then index it again)"
        if self.on_corrupt is OnCorrupt.SKIP:
            from ..contract.pipeline import SkipSample

            raise SkipSample(f"sample {i}: {failed}", where=self.where(i))
        raise ParquetReadError(f"{failed}; replace the file, or pass pipeline.on_corrupt=skip to drop such rows "
                               "(counted in the data server's samples_skipped)")

    def _checked(self, i: int, g: int, row: int) -> tuple[bytes, int]:
        """Row ``row`` of row group ``g`` (sample ``i``), its CRC32C checked; a bad cached copy decoded again."""
        data, label = pm.read_row(*self._opened(g), row)
        if data is None:
            # the cached row group failed its check: a bad copy, dropped and decoded again from the source
            count_reread()
            log.warning("sample %d (%s): the cached row fails its CRC32C; decoding the row group again", i,
                        self._where(g))
            self._reads.drop(g)
            data, label = pm.read_row(*self._opened(g), row)
            if data is None:
                raise ParquetReadError(f"sample {i} ({self._where(g)}, row {row}): its cached copy fails its "
                                       f"CRC32C twice; check the disk of the node's cache ({self.cache.dir})")
        return data, label

    def _opened(self, g: int) -> tuple[int, Any, Any, Any]:
        fd, offsets, labels, failed, crcs = self._group(g)
        if failed:  # decoded again, the row group no longer decodes: the source changed
            raise ParquetReadError(f"{failed}; replace the file")
        return fd, offsets, labels, crcs

    def _group(self, g: int) -> tuple:
        """(descriptor, offsets, labels, failure message, row CRCs) of decoded row group ``g``, kept open."""
        return self._reads.entry(g, self._open_group)

    def _open_group(self, g: int) -> tuple:
        for attempt in range(2):
            fd = self._decoded(g)
            parsed = pm.open_entry(fd, int(self.first[g + 1] - self.first[g]))
            if parsed is not None:
                return fd, *parsed
            os.close(fd)  # a damaged head (or an older release's entry): decoded again from the source
            self.cache.drop(self._reads.name(g))
            if attempt:
                raise ParquetReadError(f"{self._where(g)}: its decoded copy in {self.cache.dir} is damaged twice; "
                                       "check the disk of the node's cache")
            count_reread()
        raise AssertionError("not reached: the second attempt returns or raises")

    def _decoded(self, g: int) -> int:
        return self.cache.made(self._reads.name(g), lambda: self._decode(g), "a decoded row group")

    def _decode(self, g: int) -> list[bytes]:
        """Row group ``g`` read (the span of its two column chunks, once) and decoded into a cache entry,
        its rows compared with their checksums where ``hetero index`` wrote them; a page CRC or a row
        checksum that does not match reads it once more from the source (a transfer's damage)."""
        k, index = int(self.group_file[g]), int(self.group_index[g])
        name, size = self.files[k]
        start, stop = (int(x) for x in self.spans[g])
        meta = self._metadata(k)
        paths = pm.columns(meta.schema.to_arrow_schema(), self.image_column, self.label_column, self._url(k))
        want = self._sums(g)  # a store error propagates, as from the reads: retried later, never cached
        attempt = 0
        while True:
            raw = self._reads.read(name, start, stop)
            try:
                cols = pm.decoded(pm.read_group(meta, size, start, raw, index, paths))
            except Exception as exc:  # pyarrow's errors for bytes that do not decode
                reason = " ".join(str(exc).split()) or type(exc).__name__
                if pm.PAGE_CRC not in reason or attempt:
                    return pm.failed_entry(self._undecodable(g, reason))
                why = f"a page fails its CRC ({reason})"
            else:
                crcs = pm.row_crcs(*cols)
                bad = np.flatnonzero(crcs != want) if want is not None else ()
                if not len(bad) or attempt:
                    return self._entry(g, cols, crcs, bad)
                why = f"{len(bad)} row(s) differ from their checksums (rows {', '.join(map(str, bad[:5]))})"
            attempt += 1
            count_reread()
            log.warning("%s: %s; reading the row group again", self._where(g), why)

    def _sums(self, g: int) -> np.ndarray | None:
        """The row checksums ``hetero index`` wrote for row group ``g``, or None."""
        at = int(self.sums_at[g])
        if at < 0:
            return None
        rows = int(self.first[g + 1] - self.first[g])
        return np.frombuffer(self.sums_store.read(self.sums_key, at, at + 4 * rows), dtype="<u4")

    def _entry(self, g: int, cols: tuple, crcs: np.ndarray, bad) -> list[bytes]:
        """The cache entry of decoded row group ``g``; rows ``bad`` (unlike their checksums twice) marked."""
        offsets, data, labels = cols
        if len(bad):
            log.warning("%s: %d row(s) differ from their checksums, read twice from the source (rows %s): they are "
                        "never handed to training", self._where(g), len(bad), ", ".join(map(str, bad[:5])))
            labels = labels.copy()
            labels[bad] = pm.BAD_ROW
            crcs = pm.row_crcs(offsets, data, labels)
        return pm.entry(offsets, data, labels, crcs)

    def _undecodable(self, g: int, reason: str) -> str:
        if pm.PAGE_CRC in reason:
            reason = f"a page fails its CRC, read twice from the source: the file was damaged after it was " \
                     f"written ({reason})"
        return f"{self._where(g)}: column {self.image_column!r} or {self.label_column!r} cannot be read ({reason})"

    # -- blocks
    def block_groups(self, block: int) -> range:
        """The row groups holding block ``block``'s rows."""
        first = block * self.block_samples
        last = min(first + self.block_samples, len(self)) - 1
        return range(self.group_of(first), self.group_of(last) + 1)

    def prefetch_block(self, block: int) -> None:
        """Start reading block ``block``'s row groups into the node's cache; returns at once (a
        :class:`~data_service.contract.pipeline.BlockPrefetcher`)."""
        self._reads.prefetch(self.block_groups(block), lambda g: os.close(self._decoded(g)))

    def _url(self, k: int) -> str:
        return f"{self.store.url.rstrip('/')}/{self.files[k][0]}"

    def where(self, i: int) -> str:
        """The file holding sample ``i`` (for messages)."""
        return self._url(int(self.group_file[self.group_of(i)]))

    def _where(self, g: int) -> str:
        return (f"{self._url(int(self.group_file[g]))} row group {int(self.group_index[g])} "
                f"(samples {int(self.first[g])}..{int(self.first[g + 1]) - 1})")

