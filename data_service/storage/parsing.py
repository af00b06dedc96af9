"""Storage values as users give them: locations (a folder or ``s3://bucket/prefix``) and sizes ("256MB")."""
from __future__ import annotations

import re

from ..errors import ConfigError

_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3,
          "T": 1000**4, "TB": 1000**4, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def is_s3_url(value: str) -> bool:
    """Whether ``value`` is a string of the form ``s3://...``."""
    return isinstance(value, str) and value.startswith("s3://")


def parse_s3_url(url: str) -> tuple[str, str]:
    """``"s3://bucket/a/b"`` -> ``("bucket", "a/b")``; ``"s3://bucket"`` -> ``("bucket", "")``."""
    if not is_s3_url(url):
        raise ConfigError(f"{url!r} is not an S3 URL: expected s3://bucket/prefix")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not _BUCKET_RE.match(bucket):
        raise ConfigError(f"{url!r} does not name a valid bucket ({bucket!r}): expected s3://bucket/prefix, "
                          f"the bucket 3-63 letters, digits, dots or hyphens")
    return bucket, prefix


def check_location(url: str, what: str = "location") -> str:
    """``url`` stripped and checked: a folder path or an ``s3://bucket/prefix`` URL.

    Raises:
        ConfigError: empty, another scheme, or an S3 URL without a valid bucket (naming ``what``).
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{what}={url!r} must be a folder or s3://bucket/prefix")
    url = url.strip()
    if is_s3_url(url):
        parse_s3_url(url)
    elif "://" in url:
        raise ConfigError(f"{what}={url!r}: only a local folder or s3://bucket/prefix is supported")
    return url


def join_key(prefix: str, key: str) -> str:
    """``prefix/key`` with exactly one slash between them (either may be empty)."""
    return "/".join(part for part in (prefix.rstrip("/"), key.lstrip("/")) if part)


def parse_size(value, name: str) -> int:
    """Bytes from ``256MB``, ``1.5GiB``, ``64k`` or a plain integer; ConfigError naming ``name`` otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} must be a size such as 256MB or 1GiB")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}={value} must be >= 0")
        return value
    m = _SIZE_RE.fullmatch(str(value))
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS:
        raise ConfigError(f"{name}={value!r} must be a size such as 256MB, 1GiB or 65536 (units: "
                          "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return int(float(m.group(1)) * _UNITS[unit])
