"""What a Parquet file's footer says, read without touching its row groups.

:func:`read_footer` fetches exactly a file's footer (its last 8 bytes give the length), so the
footer and the row groups are never read twice; :func:`parse_footer` parses it alone;
:func:`columns` checks the image and label columns (naming what the file has when they are not
there); :func:`row_groups` gives each row group's rows and the byte span of the two column chunks
read; :func:`class_names` finds the ``ClassLabel`` names Hugging Face ``datasets`` keeps in the
schema. :class:`Window` lets pyarrow decode a row group from the bytes of that span alone.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass

from ..errors import ConfigError

MAGIC = b"PAR1"


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
        label_max = -1
        for c in chunks:
            if c.path_in_schema == paths[1] and c.is_stats_set and c.statistics.has_min_max:
                label_max = int(c.statistics.max)
        out.append(RowGroup(rg.num_rows, min(starts), max(s + c.total_compressed_size for s, c in zip(starts, chunks)),
                            label_max))
    return out


def class_names(schema, label: str) -> list[str] | None:
    """The ``ClassLabel`` names Hugging Face ``datasets`` keeps in the schema's metadata, if any."""
    raw = (schema.metadata or {}).get(b"huggingface")
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
