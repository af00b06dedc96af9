"""The consumer's data-plane connection to one server.

``open()`` does the handshake (version check, token proof); ``fetch()`` asks
for batches; a reader thread receives each batch straight into a fresh buffer
(one copy, kernel to user; pinned memory when asked) and posts decoded
batches, errors and its own death to a shared event queue.
"""
from __future__ import annotations

import logging
import queue
import socket
import threading
from dataclasses import dataclass
from typing import Any

from data_service import codec, framing
from data_service.errors import PermissionDeniedError, ProtocolError, VersionMismatchError
from data_service.version import PROTOCOL_VERSION, compatible, mismatch_message
from data_service.wire import pb

from .buffers import BufferPool

log = logging.getLogger(__name__)


@dataclass
class Event:
    kind: str                 # "batch" | "error" | "down"
    conn: "BulkConnection"
    ref: pb.BatchRef | None = None
    batch: Any = None
    nbytes: int = 0
    error: pb.BatchError | None = None
    exc: BaseException | None = None


class BulkConnection:
    def __init__(self, address: str, host: str, port: int, token: str, events: "queue.Queue[Event]",
                 client_id: str = "", max_batch_bytes: int = 1 << 40, pin_memory: bool = False,
                 client_version: str = PROTOCOL_VERSION) -> None:
        self.address = address
        self._host, self._port = host, port
        self._token = token
        self._events = events
        self._client_id = client_id
        self._max = max_batch_bytes
        self._pin = pin_memory
        self._version = client_version
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self.closed = False
        self.bytes_received = 0
        self._pool = BufferPool(pin_memory)

    def open(self, timeout: float = 10.0) -> None:
        """Connect and authenticate.

        Raises:
            OSError: not reachable. PermissionDeniedError / VersionMismatchError: refused.
        """
        sock = socket.create_connection((self._host, self._port), timeout=timeout)
        try:
            framing.tune(sock)
            frame = framing.recv_frame(sock)
            if frame.WhichOneof("kind") != "challenge":
                raise ProtocolError(f"{self.address}: expected a challenge, got {frame.WhichOneof('kind')!r}")
            if not compatible(self._version, frame.challenge.server_version):
                raise VersionMismatchError(f"{self.address}: " + mismatch_message(self._version, frame.challenge.server_version))
            hello = pb.BulkHello(client_version=self._version, client_id=self._client_id,
                                 proof=framing.token_proof(self._token, frame.challenge.nonce))
            framing.send_frame(sock, pb.BulkFrame(hello=hello))
            reply = framing.recv_frame(sock)
            kind = reply.WhichOneof("kind")
            if kind == "error":
                if reply.error.kind == pb.PERMISSION_DENIED:
                    raise PermissionDeniedError(f"server {self.address} refused the job token on the data plane")
                if reply.error.kind == pb.VERSION_MISMATCH:
                    raise VersionMismatchError(f"{self.address}: {reply.error.message}")
                raise ProtocolError(f"{self.address}: {reply.error.message}")
            if kind != "welcome":
                raise ProtocolError(f"{self.address}: expected welcome, got {kind!r}")
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        threading.Thread(target=self._read_loop, name=f"recv-{self.address}", daemon=True).start()

    def fetch(self, refs: list[pb.BatchRef]) -> None:
        """Ask for batches; raises OSError if the connection is gone."""
        if self._sock is None or self.closed:
            raise ConnectionError(f"connection to {self.address} is closed")
        with self._send_lock:
            framing.send_frame(self._sock, pb.BulkFrame(fetch=pb.FetchRequest(batches=refs)))

    def close(self) -> None:
        self.closed = True
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()

    def _read_loop(self) -> None:
        sock = self._sock
        try:
            while True:
                frame = framing.recv_frame(sock)
                kind = frame.WhichOneof("kind")
                if kind == "batch":
                    header = frame.batch
                    if header.payload_bytes > self._max or header.raw_bytes > self._max:
                        raise ProtocolError(f"{self.address} sent a {header.payload_bytes}-byte batch; "
                                            f"max_batch_bytes={self._max}")
                    buf = self._pool.get(header.payload_bytes)
                    if header.payload_bytes:
                        framing.recv_into(sock, memoryview(buf.numpy()))
                    self.bytes_received += header.payload_bytes
                    batch = codec.decode(header, buf, self._max)
                    self._events.put(Event("batch", self, ref=header.ref, batch=batch, nbytes=header.payload_bytes))
                elif kind == "error":
                    self._events.put(Event("error", self, ref=frame.error.ref, error=frame.error))
                else:
                    raise ProtocolError(f"{self.address}: unexpected {kind!r} frame")
        except BaseException as exc:  # any failure ends this connection; the fetcher fails over
            if not self.closed:
                self._events.put(Event("down", self, exc=exc))
            self.close()
