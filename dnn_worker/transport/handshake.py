"""The consumer's side of the data-plane handshake: version check, token proof, what was agreed."""
from __future__ import annotations

import socket

from data_service.contract import compression
from data_service.protocol import framing, version as protocol
from data_service.errors import PermissionDeniedError, ProtocolError, VersionMismatchError
from data_service.protocol.version import compatible, mismatch_message
from data_service.protocol.generated import pb


def handshake(sock: socket.socket, address: str, token: str, client_id: str, want_shm: bool) -> tuple[bool, str]:
    """Answer the server's challenge on the blocking ``sock``; returns (shared memory, compression) as
    the server agreed to them. The version announced is ``protocol.version.PROTOCOL_VERSION``, read
    at each call, as the control plane reads it: one constant says what this consumer speaks.

    Raises:
        PermissionDeniedError: the server refused the token. VersionMismatchError: incompatible
        versions. ProtocolError: anything else unexpected.
    """
    version = protocol.PROTOCOL_VERSION
    frame = framing.recv_frame(sock)
    if frame.WhichOneof("kind") != "challenge":
        raise ProtocolError(f"{address}: expected a challenge, got {frame.WhichOneof('kind')!r}")
    if not compatible(version, frame.challenge.server_version):
        raise VersionMismatchError(f"{address}: " + mismatch_message(version, frame.challenge.server_version))
    hello = pb.BulkHello(client_version=version, client_id=client_id,
                         proof=framing.token_proof(token, frame.challenge.nonce),
                         accept_compressions=compression.available(), accept_shm=want_shm,
                         host_key=framing.host_key() if want_shm else "", sealed=True)
    sock.sendall(framing.seal(pb.BulkFrame(hello=hello)))  # every frame sealed: a damaged one is refused
    reply = framing.recv_frame(sock)
    kind = reply.WhichOneof("kind")
    if kind == "error":
        if reply.error.kind == pb.PERMISSION_DENIED:
            raise PermissionDeniedError(f"server {address} refused the job token on the data plane")
        if reply.error.kind == pb.VERSION_MISMATCH:
            raise VersionMismatchError(f"{address}: {reply.error.message}")
        raise ProtocolError(f"{address}: {reply.error.message}")
    if kind != "welcome":
        raise ProtocolError(f"{address}: expected welcome, got {kind!r}")
    return reply.welcome.shm, reply.welcome.compression
