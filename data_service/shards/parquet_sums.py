"""Row checksums for Parquet files written without page CRCs: what ``hetero index`` writes for them.

Most Parquet files (pyarrow's default, Hugging Face exports) carry no page CRCs, so a flipped byte
in an image column decodes to other image bytes that nothing can tell from the right ones.
``hetero index LOCATION`` reads every row group once and writes a sidecar file holding a CRC32C
per row, over everything of the row that training reads: its image bytes, then its label (8 bytes,
little-endian, as :func:`.parquet_meta.row_crc`). :class:`~.parquet.ParquetDataset` compares each
row it decodes with it; the decoded row's entry in the node's cache keeps the same CRC32C, checked
on every read.

The sidecar is ``parquet-rows.crc32c`` in a location's folder (``<name>.crc32c`` beside a single
file), or in the folder ``hetero index --to DEST`` names (then ``pipeline.index=DEST``). Layout:
``PREFIX`` (magic, header length, CRC32C of the header), a JSON header listing each file it covers
(name, size, CRC32C of its footer, rows, where its checksums start after the header), then each
file's rows' CRC32C as ``<u4``. A file is covered while its size and rows are those indexed (a
file written again at another size reads as unchecked until it is indexed again); one whose footer
changed at the same size is still checked row by row, with a warning.

Without row checksums or page CRCs a file is read unchecked, said once per file and process
(:func:`say_unchecked`), or refused with ``unchecked="refuse"``.
"""
from __future__ import annotations

import enum
import json
import logging
import multiprocessing
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ConfigError, DataServiceError
from ..storage import StoreError, open_store
from . import parquet_meta as pm
from .checksum import first_time
from ..crc32c import crc32c as crc32c_inplace

log = logging.getLogger(__name__)

MAGIC = b"HPQSUMS1"
PREFIX = struct.Struct("<8sII")  # magic, header length, CRC32C of the header
FOLDER_NAME = "parquet-rows.crc32c"
PAGE_HEAD = 64  # bytes read to see a page header's first fields


def place(location: str, index: str = "") -> tuple[str, str, str]:
    """``(folder of the files, folder of the sidecar, sidecar name)`` for a Parquet ``location``
    (a file, or a folder or ``s3://`` prefix) whose checksums are in ``index`` ("" = beside it)."""
    single = location.endswith(".parquet")
    prefix, _, base = location.rstrip("/").rpartition("/") if single else (location, "", "")
    prefix = prefix or "."
    return prefix, index or prefix, f"{base}.crc32c" if single else FOLDER_NAME


def listed(store, location: str, versions: bool = False) -> list[tuple]:
    """``(name, size)`` of the Parquet files at ``location`` in ``store`` (the folder :func:`place`
    gives): the file itself, or every ``.parquet`` under the folder or prefix; ``versions``: with
    its version third (:func:`.parquet_meta.version`)."""
    from .wds_index import list_objects

    if not location.endswith(".parquet"):
        return list_objects(store, ".parquet", versions=versions)
    name = location.rstrip("/").rpartition("/")[2]
    return [(name, store.check(name), pm.version(store, name)) if versions else (name, store.check(name))]


def has_page_crc(head: bytes) -> bool:
    """Whether the Parquet page header at the start of ``head`` carries a CRC (its field 4).

    The header is a Thrift compact struct whose first fields are i32s: the page type (1), the
    uncompressed (2) and compressed (3) sizes, then the optional CRC (4); anything else first
    means it has none.
    """
    pos, field = 0, 0
    while pos < len(head):
        byte = head[pos]
        pos += 1
        if byte == 0:  # the struct's end
            return False
        delta, kind = byte >> 4, byte & 0x0F
        if delta:
            field += delta
        else:  # a long-form field id: a zigzag varint
            raw, pos = _varint(head, pos)
            field = (raw >> 1) ^ -(raw & 1)
        if field >= 4:
            return field == 4
        if kind != 5:  # not an i32: not a page header this reader knows
            return False
        _, pos = _varint(head, pos)
    return False


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(buf):
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return value, pos


class Check(enum.IntEnum):
    """What checks a file's rows as they are read."""

    NONE = 0  # nothing: a damaged byte decodes to other bytes
    PAGE_CRC = 1  # its writer's page CRCs, verified as pages decode
    ROW_SUMS = 2  # the row checksums `hetero index` wrote (and page CRCs where present)


UNCHECKED = {"warn": "read them, saying so once per file", "refuse": "stop at start, naming the file and the fix"}
NOTICES = 10  # files named one by one; the rest are counted


def fix(location: str, index: str) -> str:
    """The command that adds row checksums for ``location``."""
    return f"hetero index {location}" + (f" --to {index}" if index else "")


def say_unchecked(files: list[tuple[str, str]], location: str, index: str, unchecked: str) -> None:
    """``files`` (url, why) are read unchecked: ConfigError with ``unchecked="refuse"``, else a warning
    per file, once per process (the first :data:`NOTICES`). A data worker leaves the warning to its
    server, which opened the same files at start: the server's process has no multiprocessing parent."""
    command = fix(location, index)
    if files and unchecked == "refuse":
        more = f" (and {len(files) - 1} more file(s))" if len(files) > 1 else ""
        raise ConfigError(f"{files[0][0]}{more}: its rows would be read unchecked ({files[0][1]}), and "
                          f"pipeline.unchecked='refuse'; write row checksums with `{command}` (for a read-only "
                          "location: `--to DEST`, then pipeline.index=DEST), or write the files with page CRCs "
                          "(pyarrow: write_page_checksum=True)")
    files = [(url, why) for url, why in files if first_time(url)]
    level = logging.WARNING if multiprocessing.parent_process() is None else logging.DEBUG
    for url, why in files[:NOTICES]:
        log.log(level, "%s: its rows are read unchecked (%s): a damaged byte would train silently; add checksums "
                "with `%s` (pipeline.unchecked=refuse refuses unchecked data)", url, why, command)
    if len(files) > NOTICES:
        log.log(level, "%d more Parquet file(s) of %s are read unchecked: `%s` adds checksums to all of them",
                len(files) - NOTICES, location, command)


def identity(store, key: str) -> list | None:
    """What changes when the sidecar ``key`` is written again (size, and a folder's inode and
    mtime), or None when there is none."""
    try:
        size = store.size(key)
    except StoreError as exc:
        if exc.missing:
            return None
        raise
    return [key, size, pm.version(store, key)]


@dataclass(frozen=True)
class FileSums:
    """One file's entry in a sidecar: its identity when indexed, and where its rows' checksums lie."""

    size: int
    footer: int  # CRC32C of the footer as :func:`.parquet_meta.read_footer` returns it
    rows: int
    at: int  # byte offset of its first row's CRC32C in the sidecar


@dataclass(frozen=True)
class Sidecar:
    """A sidecar's header: the columns its checksums cover and the files, by name."""

    where: str
    image_column: str
    label_column: str
    files: dict[str, FileSums] = field(default_factory=dict)

    @classmethod
    def read(cls, store, key: str) -> "Sidecar":
        """The header of ``key`` in ``store``; ConfigError naming it and the fix when it is damaged."""
        where = store.key_url(key)
        magic, length, crc = PREFIX.unpack(store.read(key, 0, PREFIX.size))
        raw = store.read(key, PREFIX.size, PREFIX.size + length) if magic == MAGIC else b""
        if magic != MAGIC or crc32c_inplace(raw) != crc:
            raise ConfigError(f"{where} is not a row-checksum file `hetero index` wrote, or it was damaged (its "
                              f"header fails its CRC32C); write it again: hetero index --overwrite LOCATION")
        head = json.loads(raw)
        base = PREFIX.size + length  # the checksums follow the header; the header counts from there
        return cls(where, head["image_column"], head["label_column"],
                   {name: FileSums(size, footer, rows, base + at) for name, size, footer, rows, at in head["files"]})

    def covers(self, name: str, size: int, footer: bytes, columns: tuple[str, str]) -> tuple[FileSums | None, str]:
        """``(its entry, "")`` when the sidecar covers file ``name`` as it is now; ``(its entry, why)``
        when it covers it though the footer changed (damaged, or the file written again at the same
        size: its rows are checked all the same, so a changed row is named); else ``(None, why not)``."""
        got = self.files.get(name)
        if got is None:
            return None, f"{self.where} has no checksums for it (indexed before the file was added)"
        if columns != (self.image_column, self.label_column):
            return None, f"the checksums in {self.where} cover columns {self.image_column!r} and {self.label_column!r}"
        if got.size != size:
            return None, f"the checksums in {self.where} were made for another version of the file (written again " \
                         "since)"
        if got.footer != crc32c_inplace(footer):
            return got, f"its footer is not the one `hetero index` read into {self.where} (damaged, or the file was " \
                        "written again at the same size): its rows are checked all the same; if it was written " \
                        "again, run `hetero index --overwrite`"
        return got, ""


def file_check(store, name: str, size: int, footer: bytes, meta, columns: tuple[str, str], url: str,
               sidecar: Sidecar | None, sums_where: str) -> tuple[int, int, str]:
    """What checks file ``name`` (``footer`` and ``meta``: its footer, raw and parsed) as its rows are
    read: ``(Check, offset of its first row checksum in the sidecar or -1, why it is unchecked)``.
    A file the sidecar does not cover costs one read of :data:`PAGE_HEAD` bytes: its first page header."""
    got, why = sidecar.covers(name, size, footer, columns) if sidecar else \
        (None, f"no page CRCs, and no row checksums ({sums_where} is not there)")
    if got is not None and got.rows == meta.num_rows:
        if why:
            log.warning("%s: %s", url, why)
        return Check.ROW_SUMS, got.at, ""
    if got is not None:
        why = f"{sums_where} holds {got.rows} row checksums for its {meta.num_rows} rows"
    groups = pm.row_groups(meta, pm.columns(meta.schema.to_arrow_schema(), *columns, url), url)
    first = groups[0] if groups else None
    if first is None or has_page_crc(store.read(name, first.start, min(first.start + PAGE_HEAD, first.stop))):
        return Check.PAGE_CRC, -1, ""
    return Check.NONE, -1, f"no page CRCs; {why}" if sidecar else why


def encode(files: list[tuple[str, int, bytes, np.ndarray]], image_column: str, label_column: str) -> list[bytes]:
    """A sidecar's bytes, in pieces: ``files`` are (name, size, footer, rows' CRC32C)."""
    rows, at = [], 0
    for name, size, footer, crcs in files:
        rows.append([name, size, crc32c_inplace(footer), len(crcs), at])
        at += 4 * len(crcs)
    header = json.dumps({"image_column": image_column, "label_column": label_column, "files": rows}).encode()
    return [PREFIX.pack(MAGIC, len(header), crc32c_inplace(header)), header,
            *(crcs.astype("<u4").tobytes() for *_, crcs in files)]


@dataclass
class SumsSummary:
    """What :func:`index_parquet` wrote."""

    where: str = ""
    files: int = 0
    rows: int = 0
    bytes_read: int = 0
    page_crcs: int = 0  # files whose page CRCs were verified while they were read

    def lines(self) -> list[str]:
        return [f"wrote row checksums of {self.rows} rows in {self.files} Parquet file(s) (read "
                f"{self.bytes_read / 1e6:.1f} MB once; {self.page_crcs} with page CRCs, verified): {self.where}"]


def index_parquet(location: str, dest: str = "", *, image_column: str = "image", label_column: str = "label",
                  workers: int = 8, overwrite: bool = False,
                  progress: Callable[[int], None] | None = None) -> SumsSummary:
    """Read every row group of the Parquet files at ``location`` once and write their rows' CRC32C
    (:mod:`this module <data_service.shards.parquet_sums>`) to ``dest`` (default: beside them).

    Raises:
        ConfigError: no Parquet files, a missing column, a sidecar already there without ``overwrite``.
        DataServiceError: a row group that does not decode (naming the file and row group).
    """
    folder, out_folder, key = place(location, dest)
    store = open_store(folder, what="parquet")
    out = open_store(out_folder, what="dest", create=True) if dest else store
    if out.exists(key) and not overwrite:
        raise ConfigError(f"{out.key_url(key)} already exists; pass --overwrite to replace it")
    files = listed(store, location)

    def one(name_size: tuple[str, int]) -> tuple[str, int, bytes, np.ndarray, bool]:
        name, size = name_size
        where = store.key_url(name)
        footer = pm.read_footer(store, name, size, where)
        meta = pm.parse_footer(footer, where)
        paths = pm.columns(meta.schema.to_arrow_schema(), image_column, label_column, where)
        crcs, page_crc = [], False
        for g, rg in enumerate(pm.row_groups(meta, paths, where)):
            raw = store.read(name, rg.start, rg.stop)
            page_crc = page_crc or has_page_crc(raw[:PAGE_HEAD])
            try:
                table = pm.read_group(meta, size, rg.start, raw, g, paths)
            except Exception as exc:  # pyarrow's errors for bytes that do not decode
                raise DataServiceError(f"{where} row group {g} cannot be read ({' '.join(str(exc).split())}): no "
                                       "checksum is written for data that does not decode; replace the file") from None
            crcs.append(pm.row_crcs(*pm.decoded(table)))
        if progress is not None:
            progress(size)
        return name, size, footer, np.concatenate(crcs) if crcs else np.zeros(0, "<u4"), page_crc

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="parquet-index") as pool:
        done = list(pool.map(one, files))
    out.write_bytes(key, b"".join(encode([d[:4] for d in done], image_column, label_column)))
    return SumsSummary(out.key_url(key), len(done), sum(len(d[3]) for d in done), store.bytes_read,
                       sum(d[4] for d in done))
