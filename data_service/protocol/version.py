"""Protocol version: the major number is the proto package (heterodata.v1).

A minor version adds fields only, and peers of one major version talk, with one exception: from
1.1 on a data worker writes a batch's checksum as a CRC32C (``BatchHeader.payload_crc32c``), which a
1.0 consumer does not read, so its batches would arrive unchecked. A server of 1.1 or later refuses
such a consumer and says why. A newer consumer still checks a 1.0 server's CRC-32
(``payload_crc32``), so data nodes may run the older release while GPU nodes move first.
"""
from __future__ import annotations

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 1
PROTOCOL_VERSION = f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"
CRC32C_MINOR = 1  # the first minor version whose servers write, and clients check, the CRC32C


def _parse(version: str) -> tuple[int, int] | None:
    """(major, minor) of "M.m" or "M" (minor 0); None for anything else."""
    parts = version.split(".")
    try:
        return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0) if len(parts) <= 2 else None
    except ValueError:
        return None


def _why_not(client_version: str, server_version: str) -> str | None:
    client, server = _parse(client_version), _parse(server_version)
    if client is None or server is None or client[0] != server[0]:
        return ""  # another major version, or no version at all: nothing more to say
    if server[1] >= CRC32C_MINOR > client[1]:
        return (f"a {server_version} server writes each batch's checksum as a CRC32C, which a "
                f"{client_version} client does not check (its batches would arrive unchecked); ")
    return None


def compatible(client_version: str, server_version: str) -> bool:
    """Peers talk when their major versions match, unless the server writes a checksum the client
    cannot check (a 1.0 client of a 1.1 server; see the module docstring)."""
    return _why_not(client_version, server_version) is None


def mismatch_message(client_version: str, server_version: str) -> str:
    """Why the two cannot talk, and the fix."""
    return (f"protocol version mismatch: client speaks heterodata {client_version!r}, "
            f"server speaks {server_version!r}; {_why_not(client_version, server_version) or ''}install the same "
            "hetero-data-service release on data and GPU nodes")
