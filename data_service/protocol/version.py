"""Protocol version: the major number is the proto package (heterodata.v1)."""
from __future__ import annotations

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 0
PROTOCOL_VERSION = f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"


def compatible(client_version: str, server_version: str) -> bool:
    """Peers are compatible when their major versions match (minor adds fields only)."""
    try:
        return int(client_version.split(".")[0]) == int(server_version.split(".")[0])
    except ValueError:
        return False


def mismatch_message(client_version: str, server_version: str) -> str:
    return (
        f"protocol version mismatch: client speaks heterodata {client_version!r}, "
        f"server speaks {server_version!r}; install the same hetero-data-service "
        "release on data and GPU nodes"
    )
