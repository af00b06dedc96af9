"""CRC32C (Castagnoli) over any buffer, read in place: bytes, bytearray, memoryview, mmap, numpy.

The one checksum of the data path: per-sample checksums of shards, the batch checksum a data
worker writes over its slot and a consumer checks over its receive buffer. Why CRC32C, and not
zlib's CRC-32 or a 64-bit hash such as xxh3:

- speed without a copy: x86-64 (SSE4.2) and ARMv8 have a CRC32C instruction; three interleaved
  streams of it run at memory speed (over 10 GB/s on one core, several times zlib's CRC-32),
  so checking a batch costs a fraction of moving it;
- what it guarantees: every burst of up to 32 flipped bits, the usual shape of damage in a NIC,
  a cache or a proxy, is detected, not just likely detected; other damage passes with odds of
  2^-32 per damaged batch, and a damaged batch is fetched again, not trained on. A 64-bit hash
  lowers those odds further but guarantees nothing about bursts; the checksum guards against
  accidents, not attackers (TLS authenticates every record for that);
- one function everywhere: shards already carry CRC32Cs (index.bin), and S3, iSCSI, SCTP and
  ext4 use the same polynomial.

:func:`crc32c` uses the project's own C extension (``_hw.c``: the CPU instruction, the GIL
released for large buffers) where it was built and the CPU has SSE4.2; elsewhere google-crc32c,
handed a read-only numpy view of the buffer (its C entry point refuses writable buffers such
as bytearray, memoryview and mmap, but reads a numpy array in place), and a copy only where even
that is refused. Both give the same values (tests/test_crc32c.py).
"""
from __future__ import annotations

try:
    from ._hw import copy_extend as _hw_copy_extend, extend as _hw_extend
except ImportError:  # not built (no C compiler), or a CPU without the instruction
    _hw_extend = _hw_copy_extend = None

# which implementation runs: "sse4.2" (this package's extension) or "google-crc32c"
IMPLEMENTATION = "sse4.2" if _hw_extend is not None else "google-crc32c"


def crc32c(data, crc: int = 0) -> int:
    """The CRC32C of ``data`` (any C-contiguous buffer, read in place), continuing ``crc`` (that of
    the bytes before it); the value google_crc32c.extend(crc, bytes(data)) returns.

    Raises:
        ValueError: ``crc`` is not a 32-bit CRC. TypeError/BufferError: ``data`` is no contiguous buffer.
    """
    return _hw_extend(crc, data) if _hw_extend is not None else _portable(data, crc)


def copy_crc32c(dst, src, crc: int = 0) -> int:
    """Copy ``src`` into ``dst`` (a writable buffer of the same size, not overlapping it) and return the
    CRC32C of those bytes, continuing ``crc``: the extension sums each word on its way through a
    register, so the bytes are read from memory once, for the copy (the fallback copies, then sums).

    Raises:
        ValueError: sizes differ, or ``crc`` is not a 32-bit CRC.
    """
    return _hw_copy_extend(crc, dst, src) if _hw_copy_extend is not None else _portable_copy(dst, src, crc)


def _portable_copy(dst, src, crc: int = 0) -> int:
    """Copy, then sum the copy (see :func:`copy_crc32c`)."""
    out, into = memoryview(src).cast("B"), memoryview(dst).cast("B")
    if out.nbytes != into.nbytes:
        raise ValueError(f"copy_crc32c: dst holds {into.nbytes} bytes, src {out.nbytes}: pass a dst of src's size")
    into[:] = out
    return _portable(into, crc)


def _portable(data, crc: int = 0) -> int:
    """google-crc32c's CRC32C of ``data`` without a copy where it allows (see the module docstring)."""
    import google_crc32c
    import numpy as np

    if not 0 <= crc <= 0xFFFFFFFF:
        raise ValueError(f"crc={crc!r} is not a 32-bit CRC: pass 0, or the value an earlier call returned")
    if isinstance(data, bytes):
        return google_crc32c.extend(crc, data)
    view = memoryview(data)
    if not view.c_contiguous:
        raise BufferError(f"a {type(data).__name__} that is not C-contiguous: pass a contiguous copy")
    flat = np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view, dtype=np.uint8)
    flat.flags.writeable = False
    try:
        return google_crc32c.extend(crc, flat)
    except TypeError:  # an extension that refuses numpy arrays too: one copy
        return google_crc32c.extend(crc, flat.tobytes())
