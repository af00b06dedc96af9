"""A batch's checksum: what its data worker wrote, checked where the batch arrives over the network.

The checksum covers what makes the batch: which batch it is (seed, epoch, index), how its bytes
are laid out (structure, tensors, sizes, compression) and the payload bytes themselves. A flipped
byte anywhere in those, in a cache, a proxy or a NIC, is then named instead of trained on, and a
flip that turned one batch's identity into another's cannot pass for it.

It is a CRC32C (``data_service.crc32c``: why CRC32C, and how it runs) read in place, over the
worker's slot and over the consumer's receive buffer: no copy of the payload is made for it, and
neither side reads the payload from memory a second time to sum it. A data worker sums each word
as it copies it into its slot (``tensor_layout.write_summed_payload``); a consumer sums each piece
as it arrives (:class:`Running`), while the CPU cache still holds what the kernel just wrote.
The header part is a few hundred bytes, serialized deterministically on both sides.
Servers of protocol 1.0 wrote zlib's CRC-32 into another field (``payload_crc32``); a consumer
still checks that one when it meets such a server.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..crc32c import crc32c
from .generated import pb

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


@dataclass(frozen=True)
class Mismatch:
    """A batch whose bytes differ from those its data worker summed: which checksum, and both values."""

    checksum: str  # "CRC32C", or "CRC-32" from a server of protocol 1.0
    got: int  # over the bytes that arrived
    want: int  # what the data worker wrote


def _identity(header: pb.BatchHeader) -> bytes:
    identity = pb.BatchHeader(ref=header.ref, structure=header.structure, tensors=header.tensors,
                              payload_bytes=header.payload_bytes, raw_bytes=header.raw_bytes,
                              compression=header.compression)
    serialized: bytes = identity.SerializeToString(deterministic=True)
    return serialized


def header_crc(header: pb.BatchHeader) -> int:
    """CRC32C of ``header``'s identity and layout: what the payload's bytes continue (a data worker
    sums them as it copies them into its slot)."""
    return crc32c(_identity(header))


def batch_crc(header: pb.BatchHeader, payload: Buffer) -> int:
    """CRC32C of ``header``'s identity and layout, then of the first ``header.payload_bytes`` bytes of
    ``payload`` (any buffer, read in place: the worker's slot, the consumer's receive buffer)."""
    return crc32c(memoryview(payload)[:header.payload_bytes], header_crc(header))


def sealed(header: pb.BatchHeader) -> bool:
    """The header carries a checksum to check (CRC32C, or a 1.0 server's CRC-32)."""
    return bool(header.HasField("payload_crc32c") or header.HasField("payload_crc32"))


class Running:
    """A sealed batch's checksum, summed piece by piece as its payload arrives, in order."""

    __slots__ = ("_crc", "_fn", "_name", "_want")

    def __init__(self, header: pb.BatchHeader) -> None:
        self._fn: Callable[[Buffer, int], int]
        if header.HasField("payload_crc32c"):
            self._fn, self._name, self._want = crc32c, "CRC32C", header.payload_crc32c
        elif header.HasField("payload_crc32"):  # a server of protocol 1.0
            self._fn, self._name, self._want = zlib.crc32, "CRC-32", header.payload_crc32
        else:
            raise ValueError(f"batch {header.ref.epoch}/{header.ref.index}'s header carries no checksum: "
                             "check integrity.sealed(header) first")
        self._crc = self._fn(_identity(header))

    def update(self, piece: Buffer) -> None:
        """Add the next bytes of the payload (any buffer, read in place)."""
        self._crc = self._fn(piece, self._crc)

    def mismatch(self) -> Mismatch | None:
        """Once the whole payload was added: how it fails the checksum its data worker wrote, or None."""
        return None if self._crc == self._want else Mismatch(self._name, self._crc, self._want)
