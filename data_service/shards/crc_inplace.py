"""CRC32C of any buffer, read in place: bytes, bytearrays, memoryviews, numpy arrays, without a copy.

google-crc32c's C entry point takes only read-only buffers, so ``bytes(view)`` is the usual way in:
a copy that costs more than the CRC itself (the CRC instruction runs at several GB/s). A read-only
numpy view of the same memory is accepted as it is.
"""
from __future__ import annotations

import google_crc32c
import numpy as np

try:
    from google_crc32c import _crc32c as _c  # the C extension (the CPU's CRC instruction)
except ImportError:  # the package's pure-Python build: correct, slower, and only on bytes
    _c = None


def crc32c_inplace(data, crc: int = 0) -> int:
    """The CRC32C of ``data`` (any bytes-like object or uint8 array), continuing ``crc``."""
    if isinstance(data, bytes):
        return _c.extend(crc, data) if _c is not None else google_crc32c.extend(crc, data)
    if _c is None:
        return google_crc32c.extend(crc, bytes(data))
    view = data.view() if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    view.flags.writeable = False
    return _c.extend(crc, view)
