"""A wire encoding as a value: parsed once where a name enters (a pipeline option, a server's Hello).

Torch-free, so a data server's main process, the planner and the consumer's handshake read and
compare encodings without the codecs (:mod:`data_service.contract.wire_encoding` holds those).
The canonical name (:attr:`WireEncoding.name`) is what crosses process and network boundaries.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import ConfigError

UINT8, UP_ZSTD, JPEG = "uint8", "up-zstd", "jpeg"
KINDS = (UINT8, UP_ZSTD, JPEG)
DEFAULT_JPEG_QUALITY = 90
HELP = ("'uint8' (as built), 'up-zstd' (lossless) or 'jpeg:Q' (lossy, quality Q in 1..100; "
        f"'jpeg' = 'jpeg:{DEFAULT_JPEG_QUALITY}')")


@dataclass(frozen=True)
class WireEncoding:
    """A parsed encoding: ``kind`` (``uint8``, ``up-zstd`` or ``jpeg``) and the JPEG ``quality``
    (0 for the others). Build one with :func:`parse`; the constructor checks its fields too."""

    kind: str = UINT8
    quality: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"unknown wire encoding kind={self.kind!r}; use {HELP}")
        if self.kind == JPEG and not 1 <= self.quality <= 100 or self.kind != JPEG and self.quality:
            raise ConfigError(f"wire encoding {self.kind!r} with quality={self.quality!r}: only 'jpeg' takes a "
                              "quality, in 1..100")

    @property
    def name(self) -> str:
        """The canonical name (``jpeg:90``), as servers announce it."""
        return f"{JPEG}:{self.quality}" if self.kind == JPEG else self.kind

    @property
    def encoded(self) -> bool:
        """Whether batches carry something other than the uint8 images as built."""
        return self.kind != UINT8

    def __str__(self) -> str:
        return self.name


def parse(name: "str | WireEncoding") -> WireEncoding:
    """The encoding a name selects, in any case; ``""`` is ``uint8``; a parsed value is returned as is.

    Raises:
        ConfigError: not a string, an unknown name or a JPEG quality outside 1..100, naming the value.
    """
    if isinstance(name, WireEncoding):
        return name
    # checked before the cache, which would fail on a list or dict with "unhashable type"
    if not isinstance(name, str):
        raise ConfigError(f"wire_encoding={name!r} must be a string: {HELP}")
    return _parse(name)


@functools.lru_cache(maxsize=64)
def _parse(name: str) -> WireEncoding:
    text = name.strip().lower()
    if text in ("", UINT8):
        return WireEncoding()
    if text == UP_ZSTD:
        return WireEncoding(UP_ZSTD)
    kind, colon, quality = text.partition(":")
    if kind == JPEG:
        if not colon:
            return WireEncoding(JPEG, DEFAULT_JPEG_QUALITY)
        # isdigit() alone takes '²' or '٣', which int() then refuses
        if not (quality.isascii() and quality.isdigit()) or not 1 <= int(quality) <= 100:
            raise ConfigError(f"wire_encoding={name!r}: the JPEG quality must be an integer in 1..100, e.g. "
                              f"'jpeg:{DEFAULT_JPEG_QUALITY}'; use {HELP}")
        return WireEncoding(JPEG, int(quality))
    raise ConfigError(f"unknown wire_encoding={name!r}; use {HELP}")
