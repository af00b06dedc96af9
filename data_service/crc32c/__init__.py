"""CRC32C over any buffer, read in place (``inplace.py``: why CRC32C, and how it runs)."""
from __future__ import annotations

from .inplace import IMPLEMENTATION, copy_crc32c, crc32c

__all__ = ["IMPLEMENTATION", "copy_crc32c", "crc32c"]
