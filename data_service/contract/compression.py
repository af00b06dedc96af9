"""Optional per-batch compression (lz4 or zstd from PyPI; extra ``compress``).

Off by default: on a fast network, compressing costs more CPU time than it
saves in transfer. The stats call reports bytes sent against raw bytes and the
seconds spent compressing, so a user can see when it pays.
"""
from __future__ import annotations

from ..errors import ConfigError, ProtocolError, install_extra

NAMES = ("", "lz4", "zstd")


def check(name: str) -> None:
    """Raise ConfigError unless ``name`` is known and its package is installed."""
    if name not in NAMES:
        raise ConfigError(f"compression={name!r} must be one of {NAMES[1:]} or '' (off)")
    try:
        if name == "lz4":
            import lz4.frame  # noqa: F401
        elif name == "zstd":
            import zstandard  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"compression={name!r} needs {exc.name}: {install_extra('compress')}") from exc


def available() -> list[str]:
    out = []
    for name in NAMES[1:]:
        try:
            check(name)
            out.append(name)
        except ConfigError:
            pass
    return out


def compress(name: str, data) -> bytes:
    if name == "lz4":
        import lz4.frame

        return lz4.frame.compress(data, compression_level=0)
    import zstandard

    return zstandard.ZstdCompressor(level=1).compress(data)


def decompress_into(name: str, src, dst) -> None:
    """Decompress ``src`` into ``dst`` (a writable buffer of exactly the raw size).

    Raises:
        ProtocolError: corrupt data or a size other than announced (no decompression bombs:
            the output is capped at ``len(dst)``).
    """
    n = len(dst)
    try:
        if name == "lz4":
            import lz4.frame

            out = lz4.frame.LZ4FrameDecompressor().decompress(src, max_length=n)
        elif name == "zstd":
            import zstandard

            out = zstandard.ZstdDecompressor().decompressobj().decompress(src)
            if len(out) > n:
                raise ProtocolError(f"zstd batch inflates past the announced {n} bytes")
        else:
            raise ProtocolError(f"unknown compression {name!r}")
    except ProtocolError:
        raise
    except Exception as exc:  # corrupt frames raise library-specific errors
        raise ProtocolError(f"cannot decompress {name} batch: {exc}") from None
    if len(out) != n:
        raise ProtocolError(f"{name} batch decompressed to {len(out)} bytes, header says {n}")
    dst[:] = out
