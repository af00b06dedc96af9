"""What a Parquet file's footer says, read without touching its row groups.

:func:`read_footer` fetches exactly a file's footer (its last 8 bytes give the length), so the
footer and the row groups are never read twice; :func:`parse_footer` parses it alone;
:func:`columns` checks the image and label columns (naming what the file has when they are not
there); :func:`row_groups` gives each row group's rows and the byte span of the two column chunks
read; :func:`class_names` finds the ``ClassLabel`` names Hugging Face ``datasets`` keeps in the
schema. :class:`Window` lets pyarrow decode a row group from the bytes of that span alone.

A decoded row group's entry in the node's cache (:func:`entry`, :func:`open_entry`, :func:`read_row`)
carries a CRC32C over each row's image bytes and label (:func:`row_crcs`), checked on every read of
a row.
"""
from __future__ import annotations

import io
import json
import os
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..storage import LocalStore
from ..crc32c import crc32c as crc32c_inplace

MAGIC = b"PAR1"
BLOCK = b"HPQBLK2\n"  # a decoded row group: n, offsets (n + 1), labels (n), CRC32C of each row (n), the images
FAILED = b"HPQFAIL\n"  # a row group that does not decode: the message follows
HEAD = struct.Struct("<8sQ")
PAGE_CRC = "CRC checksum verification failed"  # pyarrow's message for a page whose CRC does not match
NO_LABEL, BAD_ROW = -1, -2  # labels of a decoded row: no label; bytes unlike the row checksum `hetero index` wrote


@dataclass(frozen=True)
class RowGroup:
    """One row group: its rows, the byte span ``[start, stop)`` of the columns read, the labels' largest value."""

    rows: int
    start: int
    stop: int
    label_max: int  # -1: no statistics


def read_footer(store, name: str, size: int, where: str) -> bytes:
    """The footer of ``name`` (``size`` bytes) with its 8-byte trailer: two ranged reads of nothing else.

    Raises:
        ConfigError: not a Parquet file, or a footer longer than the file.
    """
    end = store.read(name, size - 8, size) if size >= 12 else b""
    if end[-4:] != MAGIC:
        raise ConfigError(f"{where} is not a Parquet file (no PAR1 at its end); remove it from the location or "
                          "name a single file")
    need = int.from_bytes(end[:4], "little") + 8
    if need + 4 > size:
        raise ConfigError(f"{where}: its footer claims {need} bytes of a {size}-byte file; replace it")
    return store.read(name, size - need, size - 8) + end


def parse_footer(footer: bytes, where: str):
    """``pyarrow.parquet.FileMetaData`` of a footer from :func:`read_footer`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(pa.py_buffer(MAGIC + footer))  # the footer parses on its own
    except Exception as exc:  # pyarrow's errors for bytes that are not a footer
        raise ConfigError(f"{where}: its Parquet footer cannot be read ({exc}); replace the file") from None


def columns(schema, image_column: str, label_column: str, where: str) -> tuple[str, str]:
    """The leaf paths read for the image (``image`` or ``image.bytes``) and label columns of ``schema``
    (an Arrow schema); ConfigError naming the columns the file has when one is missing or mistyped."""
    import pyarrow as pa

    have = ", ".join(f"{f.name} ({f.type})" for f in schema)
    missing = [c for c in (image_column, label_column) if c not in schema.names]
    if missing:
        raise ConfigError(f"{where} has no column {', '.join(map(repr, missing))} (it has {have}); pass "
                          "pipeline.image_column= and pipeline.label_column=")
    image, path = schema.field(image_column).type, image_column
    if pa.types.is_struct(image) and image.get_field_index("bytes") >= 0:
        image, path = image.field("bytes").type, f"{image_column}.bytes"
    if not (pa.types.is_binary(image) or pa.types.is_large_binary(image)):
        raise ConfigError(f"{where}: column {image_column!r} is {schema.field(image_column).type}, not image bytes "
                          "(binary, or a struct with a binary 'bytes' field); name the image column with "
                          f"pipeline.image_column= (the file has {have})")
    if not pa.types.is_integer(schema.field(label_column).type):
        raise ConfigError(f"{where}: column {label_column!r} is {schema.field(label_column).type}, not integer "
                          f"labels; name the label column with pipeline.label_column= (the file has {have})")
    return path, label_column


def row_groups(meta, paths: tuple[str, str], where: str) -> list[RowGroup]:
    """Each row group of ``meta``: rows, the span of the column chunks at ``paths``, the label statistics."""
    out = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        chunks = [rg.column(j) for j in range(rg.num_columns) if rg.column(j).path_in_schema in paths]
        if len(chunks) != 2:
            raise ConfigError(f"{where}: row group {g} lacks column {paths[0]!r} or {paths[1]!r}; replace the file")
        starts = [c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else
                  c.data_page_offset for c in chunks]
        label_max = max((int(c.statistics.max) for c in chunks
                         if c.path_in_schema == paths[1] and c.is_stats_set and c.statistics.has_min_max), default=-1)
        out.append(RowGroup(rg.num_rows, min(starts), max(s + c.total_compressed_size for s, c in zip(starts, chunks)),
                            label_max))
    return out


def group_table(metas, image_column: str, label_column: str, urls: list[str], location: str,
                checks: list[tuple[int, int, str]] | None = None) -> bytes:
    """The row groups of every file (``metas``: their footers) as columns (first row, file, index in
    the file, byte span, where its rows' checksums start in the sidecar or -1) and, per file, what
    checks it and why not (``checks``: (check, offset of its first row's checksum or -1, why)) and
    the classes, saved with ``numpy.savez``."""
    checks = checks or [(0, -1, "")] * len(metas)
    firsts, files, groups, spans, sums_at, label_max, names = [0], [], [], [], [], -1, None
    for k, meta in enumerate(metas):
        schema = meta.schema.to_arrow_schema()
        paths = columns(schema, image_column, label_column, urls[k])
        at = checks[k][1]
        for g, rg in enumerate(row_groups(meta, paths, urls[k])):
            firsts.append(firsts[-1] + rg.rows)
            files.append(k)
            groups.append(g)
            spans.append((rg.start, rg.stop))
            sums_at.append(at)
            at = at + 4 * rg.rows if at >= 0 else -1
            label_max = max(label_max, rg.label_max)
        names = names or class_names(schema, label_column)
    if firsts[-1] == 0:
        raise ConfigError(f"{location}: the Parquet files hold no rows")
    out = io.BytesIO()
    np.savez(out, first=np.array(firsts, dtype=np.int64), group_file=np.array(files, dtype=np.int32),
             group_index=np.array(groups, dtype=np.int32), spans=np.array(spans, dtype=np.int64).reshape(-1, 2),
             sums_at=np.array(sums_at, dtype=np.int64), checks=np.array([c for c, _, _ in checks], dtype=np.int8),
             notes=np.frombuffer(json.dumps([why for _, _, why in checks]).encode(), dtype=np.uint8),
             classes=np.frombuffer(json.dumps(names or [str(c) for c in range(label_max + 1)]).encode(),
                                   dtype=np.uint8))
    return out.getvalue()


def class_names(schema, label: str) -> list[str] | None:
    """The ``ClassLabel`` names Hugging Face ``datasets`` keeps in the schema's metadata, if any."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        feature = json.loads(raw)["info"]["features"][label]
        names = feature.get("names") if isinstance(feature, dict) else None
        return [str(n) for n in names] if names else None
    except (TypeError, ValueError, KeyError):
        return None


class Window(io.RawIOBase):
    """A file of ``size`` bytes of which only ``data`` at ``start`` is held: pyarrow, given the file's
    metadata, reads a row group's column chunks from it and nothing else."""

    def __init__(self, size: int, start: int, data: bytes) -> None:
        self.size, self.start, self.data, self.pos = size, start, data, 0

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
        if not self.start <= self.pos <= self.pos + n <= self.start + len(self.data):
            raise OSError(f"bytes {self.pos}..{self.pos + n} of the Parquet file were not read (outside the row group)")
        buf[:n] = self.data[self.pos - self.start:self.pos - self.start + n]
        self.pos += n
        return n


def read_group(meta, size: int, start: int, raw: bytes, index: int, paths: tuple[str, str]):
    """Row group ``index`` of a file of ``size`` bytes (``meta``: its footer) decoded from ``raw``, the
    bytes of its columns ``paths`` from ``start``: an Arrow table, page CRCs verified where present.

    Raises:
        OSError, ValueError: pyarrow's errors for bytes that do not decode (:data:`PAGE_CRC` in the
            message of a page whose CRC does not match).
    """
    import pyarrow.parquet as pq

    return pq.ParquetFile(Window(size, start, raw), metadata=meta, page_checksum_verification=True).read_row_group(
        index, columns=list(paths), use_threads=False)


def version(store, key: str) -> str:
    """What changes when the file ``key`` is written again (a folder's file: inode and mtime; S3: "")."""
    if isinstance(store, LocalStore):
        st = os.stat(store.key_url(key))
        return f"{st.st_ino}-{st.st_mtime_ns}"
    return ""


def row_crc(data, label: int) -> int:
    """CRC32C of a decoded row: its image bytes, then its label (8 bytes, little-endian)."""
    return crc32c_inplace(label.to_bytes(8, "little", signed=True), crc32c_inplace(data))


def row_crcs(offsets, data, labels) -> np.ndarray:
    """:func:`row_crc` of every row of decoded columns (:func:`decoded`), as ``<u4``."""
    return np.array([row_crc(data[int(offsets[r]):int(offsets[r + 1])], int(labels[r])) for r in range(len(labels))],
                    dtype="<u4")


def decoded(table) -> tuple[np.ndarray, memoryview, np.ndarray]:
    """``(offsets, image bytes back to back, labels)`` of a decoded row group (an Arrow table: the
    image column, then the labels); a null image is empty, a null label :data:`NO_LABEL`."""
    images = table.column(0).combine_chunks()
    if images.type.num_fields:  # the struct: its bytes field (flatten: a null struct is a null image)
        images = images.flatten()[images.type.get_field_index("bytes")]
    offsets, data = _binary(images)
    labels = table.column(1).to_numpy(zero_copy_only=False)
    if labels.dtype.kind == "f":  # nulls came out as NaN
        labels = np.where(np.isnan(labels), NO_LABEL, labels)
    return offsets, data, labels.astype("<i8")


def entry(offsets, data, labels, crcs=None) -> list[bytes]:
    """The cache entry of decoded columns (:func:`decoded`) and their row CRCs (computed when None)."""
    crcs = row_crcs(offsets, data, labels) if crcs is None else crcs
    return [HEAD.pack(BLOCK, len(labels)), offsets.tobytes(), labels.tobytes(), crcs.astype("<i8").tobytes(), data]


def failed_entry(message: str) -> list[bytes]:
    """The cache entry of a row group that does not decode: why."""
    return [HEAD.pack(FAILED, len(message.encode())), message.encode()]


def open_entry(fd: int, rows: int) -> tuple | None:
    """(offsets, labels, failure message, row CRCs) of the entry at ``fd`` of a row group of ``rows``
    rows; None for a damaged head (or an older release's entry): to be decoded again."""
    magic, n = HEAD.unpack(os.pread(fd, HEAD.size, 0))
    if magic == FAILED:
        return None, None, os.pread(fd, min(n, 1 << 16), HEAD.size).decode("utf-8", "replace"), None
    columns = np.frombuffer(os.pread(fd, 24 * rows + 8, HEAD.size), dtype="<i8")
    if magic != BLOCK or n != rows or len(columns) != 3 * rows + 1:
        return None
    return columns[:n + 1], columns[n + 1:2 * n + 1], "", columns[2 * n + 1:]


def read_row(fd: int, offsets, labels, crcs, row: int) -> tuple[bytes | None, int]:
    """(image bytes, label) of ``row`` of an open entry; None for bytes that fail the row's CRC32C."""
    base = HEAD.size + 24 * len(labels) + 8
    start, stop = int(offsets[row]), int(offsets[row + 1])
    if not 0 <= start <= stop <= os.fstat(fd).st_size - base:  # a damaged offset: never a read elsewhere
        return None, -1
    data = os.pread(fd, stop - start, base + start)
    label = int(labels[row])
    if len(data) != stop - start or row_crc(data, label) != int(crcs[row]):
        return None, label
    return data, label


def _binary(array) -> tuple[np.ndarray, memoryview]:
    """A binary Arrow array as ``(offsets, data)``: ``n + 1`` offsets from 0 and the values back to
    back, from the array's own buffers (no copy per value); a null is an empty value."""
    import pyarrow as pa

    if array.null_count:  # a null's slot may hold bytes: rebuild without them
        array = pa.array([v if v is not None else b"" for v in array.to_pylist()], type=array.type)
    width = 8 if pa.types.is_large_binary(array.type) else 4
    _, offsets, data = array.buffers()
    offsets = np.frombuffer(offsets, dtype=f"<i{width}")[array.offset:array.offset + len(array) + 1].astype("<i8")
    view = memoryview(data)[int(offsets[0]):int(offsets[-1])] if data is not None else memoryview(b"")
    return offsets - offsets[0], view
