"""A batch's checksum: what its data worker wrote, checked where the batch arrives over the network.

The CRC-32 covers what makes the batch: which batch it is (seed, epoch, index), how its bytes
are laid out (structure, tensors, sizes, compression) and the payload bytes themselves. A flipped
byte anywhere in those, in a cache, a proxy or a NIC, is then named instead of trained on, and a
flip that turned one batch's identity into another's cannot pass for it. zlib's CRC-32 reads the
payload in place at a few GB/s (google-crc32c would need a copy of it first); the header part is a
few hundred bytes, serialized deterministically on both sides.
"""
from __future__ import annotations

import zlib

from .generated import pb


def batch_crc(header: pb.BatchHeader, payload) -> int:
    """CRC-32 of ``header``'s identity and layout, then of the ``header.payload_bytes`` bytes of
    ``payload`` (any buffer: the worker's slot, the consumer's receive buffer)."""
    identity = pb.BatchHeader(ref=header.ref, structure=header.structure, tensors=header.tensors,
                              payload_bytes=header.payload_bytes, raw_bytes=header.raw_bytes,
                              compression=header.compression)
    crc = zlib.crc32(identity.SerializeToString(deterministic=True))
    return zlib.crc32(memoryview(payload)[:header.payload_bytes], crc)
