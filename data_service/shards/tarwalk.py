"""Walking a tar file's members in one forward pass over a store, recording where each member's data lies.

:class:`ForwardReader` reads one object of a :class:`~data_service.storage.Store` front to back in
large ranged reads (a folder's file or an S3 object alike) and skips what the caller does not want
inside the bytes it already holds, so no byte of the object is fetched twice. :func:`members`
walks the 512-byte tar headers on it: ustar and GNU (``L`` long names, base-256 sizes) and POSIX
pax (``x`` path and size records), which covers what ``tarfile``, GNU tar and the ``webdataset``
library write. Only the members the caller asks for are read; the others' data is skipped.

A header whose checksum does not match, a member whose data runs past the end of the object, or a
compressed file is a :class:`TarError` naming the object and the byte where it went wrong; the
members before it were whole. A tar that stops at a member boundary without its end-of-archive
blocks (two 512-byte zero blocks), as after an interrupted upload, is an :class:`Unended` raised
once every member has been yielded: all of them are whole, but members may be missing after them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from ..errors import DataServiceError
from .checksum import crc32c

BLOCK = 512
CHUNK = 8 << 20  # bytes per ranged read
COMPRESSED = {b"\x1f\x8b": "gzip", b"BZ": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
REGULAR = (b"0", b"\0", b"7")
MAX_RECORD = 1 << 20  # the most a GNU long name or pax record may hold: it is read into memory


class TarError(DataServiceError):
    """An object is not a whole, plain tar file (corrupt header, truncated, compressed).

    Attributes: ``where`` (the object), ``at`` (the byte offset where the walk stopped), ``member``
    (the name of the member whose data was cut, "" when its header was not read whole).
    """

    def __init__(self, where: str, at: int, reason: str, member: str = "") -> None:
        super().__init__(f"{where}: {reason} at byte {at}")
        self.where, self.at, self.reason, self.member = where, at, reason, member


class Unended(TarError):
    """A tar that ends at a member boundary without its end-of-archive blocks: its members are whole,
    but it was cut short (an interrupted upload or copy), so members after them may be missing."""


@dataclass(frozen=True)
class Member:
    """A regular file in the tar: its ``name``, where its data starts, its size, and its bytes when asked for
    and no larger than the walk's ``max_data`` (else ``None``)."""

    name: str
    offset: int
    size: int
    data: bytes | None = None
    crc32c: int | None = None  # of the data, for the members the walk's ``summed`` picks


class ForwardReader:
    """Bytes of ``key`` in ``store`` read front to back in ranged reads of ``chunk`` bytes; skips are free."""

    def __init__(self, store, key: str, size: int, chunk: int = CHUNK) -> None:
        self.store, self.key, self.size, self.chunk = store, key, size, chunk
        self.pos = 0
        self._buf, self._at = b"", 0

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes at the current position (fewer only at the end of the object)."""
        end = min(self.size, self.pos + n)
        if end > self._at + len(self._buf) or self.pos < self._at:
            held = self._buf[self.pos - self._at:] if self._at <= self.pos < self._at + len(self._buf) else b""
            start = self.pos + len(held)  # the next byte no read has fetched: ranges never overlap
            stop = min(self.size, max(end, start + self.chunk))
            self._buf, self._at = held + self.store.read(self.key, start, stop), self.pos
        out = self._buf[self.pos - self._at:end - self._at]
        self.pos += len(out)
        return out

    def skip(self, n: int) -> None:
        self.pos += n


def members(reader: ForwardReader, wanted: Callable[[str], bool], where: str = "",
            max_data: int | None = None, summed: Callable[[str], bool] | None = None) -> Iterator[Member]:
    """The regular members of the tar on ``reader``, in order; ``data`` read for those ``wanted(name)``
    of at most ``max_data`` bytes (None: any size); a larger one is skipped unread, its ``data`` None.
    For those ``summed(name)``, ``crc32c`` is their data's CRC32C (read in pieces, not held whole).

    Raises:
        TarError: a compressed file, a corrupt header, or data past the end of the object.
        Unended: after the last member, when the object ends without its two end-of-archive blocks.
    """
    where = where or reader.key
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        at = reader.pos
        header = reader.read(BLOCK)
        if header == bytes(BLOCK) and len(reader.read(BLOCK)) == BLOCK:
            return  # a second block after a zero one: tar readers stop at the first (GNU tar warns of a lone one)
        if header == bytes(len(header)):  # nothing, or zeros short of two blocks: the file stops at a boundary
            raise Unended(where, min(at, reader.size), "the file ends without its end-of-archive blocks (two "
                                                        "512-byte zero blocks): it was cut short")
        if at == 0:
            for magic, codec in COMPRESSED.items():
                if header.startswith(magic):
                    raise TarError(where, 0, f"{codec}-compressed: ranged reads need a plain .tar; decompress the "
                                             "shards (or write them again with `hetero prepare`)")
        if len(header) < BLOCK:
            raise TarError(where, at, "truncated inside a tar header")
        # a header's checksum: the sum of its bytes, those of the checksum field counted as spaces
        if sum(header[:148]) + 8 * 32 + sum(header[156:]) != _number(header[148:156], where, at):
            raise TarError(where, at, "a tar header's checksum does not match (not a tar file, or corrupt)")
        kind = header[156:157]
        size = _number(header[124:136], where, at)
        if kind in REGULAR and "size" in pax:
            text = pax["size"].strip()
            if not text.isdigit():
                raise TarError(where, at, f"a pax size record holds {pax['size']!r}, not a number (corrupt)")
            size = int(text)
        if size < 0:  # base-256 can say so; a negative skip would walk back over headers already read
            raise TarError(where, at, f"a tar header gives a member size of {size} bytes (corrupt)")
        data_at = at + BLOCK
        padded = -(-size // BLOCK) * BLOCK
        if data_at + size > reader.size:
            name = (pax.get("path") or long_name or _name(header)) if kind in REGULAR else ""
            raise TarError(where, at, f"truncated: a member{f' {name!r}' if name else ''} of {size} bytes runs past "
                                      f"the end of the file ({reader.size} bytes)", member=name)
        if kind in (b"L", b"x", b"g") and size > MAX_RECORD:
            raise TarError(where, at, f"a {kind.decode()!r} header record of {size} bytes (more than {MAX_RECORD}; "
                                      "corrupt)")
        if kind == b"L":
            long_name = reader.read(padded)[:size].split(b"\0", 1)[0].decode("utf-8", "replace")
            continue
        if kind in (b"x", b"g"):
            records = _pax(reader.read(padded)[:size])
            if kind == b"x":
                pax = records
            continue
        if kind not in REGULAR:  # folders, links, devices: no sample data
            reader.skip(padded)
            long_name, pax = None, {}
            continue
        name = pax.get("path") or long_name or _name(header)
        long_name, pax = None, {}
        data, crc = None, None
        if wanted(name) and (max_data is None or size <= max_data):
            data = reader.read(size)
            reader.skip(padded - size)
            if summed is not None and summed(name):
                crc = crc32c(data)
        elif summed is not None and summed(name):
            crc, left = 0, size
            while left:
                piece = reader.read(min(left, CHUNK))
                if not piece:
                    break
                crc, left = crc32c(piece, crc), left - len(piece)
            reader.skip(padded - size + left)
        else:
            reader.skip(padded)
        yield Member(name, data_at, size, data, crc)


def _name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "replace")


def _number(field: bytes, where: str, at: int) -> int:
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256 (sizes of 8 GiB and more)
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[:1] == b"\xff" else value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarError(where, at, f"a tar header holds {field!r} where a number belongs (not a tar file, or "
                                  "corrupt)") from None


def _pax(raw: bytes) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(raw):
        space = raw.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(raw[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        key, _, value = raw[space + 1:pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return out
