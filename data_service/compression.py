"""Optional per-batch compression (lz4 or zstd from PyPI; extra ``compress``).

Off by default: on a fast network, compressing costs more CPU time than it
saves in transfer. The stats call reports bytes sent against raw bytes and the
seconds spent compressing, so a user can see when it pays.
"""
from __future__ import annotations

from .errors import ConfigError, ProtocolError

CODECS = ("", "lz4", "zstd")


def check(codec: str) -> None:
    """Raise ConfigError unless ``codec`` is known and its package is installed."""
    if codec not in CODECS:
        raise ConfigError(f"compression={codec!r} must be one of {CODECS[1:]} or '' (off)")
    try:
        if codec == "lz4":
            import lz4.frame  # noqa: F401
        elif codec == "zstd":
            import zstandard  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"compression={codec!r} needs {exc.name}: pip install 'hetero-data-service[compress]'") from exc


def available() -> list[str]:
    out = []
    for codec in CODECS[1:]:
        try:
            check(codec)
            out.append(codec)
        except ConfigError:
            pass
    return out


def compress(codec: str, data) -> bytes:
    if codec == "lz4":
        import lz4.frame

        return lz4.frame.compress(data, compression_level=0)
    import zstandard

    return zstandard.ZstdCompressor(level=1).compress(data)


def decompress_into(codec: str, src, dst) -> None:
    """Decompress ``src`` into ``dst`` (a writable buffer of exactly the raw size).

    Raises:
        ProtocolError: corrupt data or a size other than announced (no decompression bombs:
            the output is capped at ``len(dst)``).
    """
    n = len(dst)
    try:
        if codec == "lz4":
            import lz4.frame

            out = lz4.frame.LZ4FrameDecompressor().decompress(src, max_length=n)
        elif codec == "zstd":
            import zstandard

            out = zstandard.ZstdDecompressor().decompressobj().decompress(src)
            if len(out) > n:
                raise ProtocolError(f"zstd batch inflates past the announced {n} bytes")
        else:
            raise ProtocolError(f"unknown codec {codec!r}")
    except ProtocolError:
        raise
    except Exception as exc:  # corrupt frames raise library-specific errors
        raise ProtocolError(f"cannot decompress {codec} batch: {exc}") from None
    if len(out) != n:
        raise ProtocolError(f"{codec} batch decompressed to {len(out)} bytes, header says {n}")
    dst[:] = out
