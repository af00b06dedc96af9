"""The consumer's data-plane connection to one server, driven by the caller's thread.

``open()`` does the handshake (version check, token proof) and leaves the socket
non-blocking; ``fetch()`` asks for batches (``BatchId`` s, made ``pb.BatchRef`` s here, as the frame
is written; every batch or error read names its batch as a ``BatchId`` again). Every frame it sends is sealed with its CRC-32
(``framing.seal``): a server that finds one damaged says so in an error without a ref and
closes, which ends the connection here (the fetcher asks again on a new one). The connection has no thread of its own: whoever
iterates (the ``Fetcher``, one selector over every server) calls ``read_events()`` when the
socket is readable. Frames are parsed from a receive buffer, and each TCP batch's payload is
received straight into a pooled buffer (one copy, kernel to user; pinned memory when asked),
resuming wherever the last read stopped. While the rest of a large payload is on its way, the
socket's low-water mark (``SO_RCVLOWAT``) keeps the selector quiet until it is there.

When the server runs on this host, batches stay in its shared-memory slots. A slot that comes
with a lease is mapped and the batch's tensors are views of it (zero copy); when the last of
them is gone a finalizer sends the slot's ``Release`` on whatever thread dropped it (or, when
the socket is busy at that moment, leaves it for the next ``flush()``). Without a lease (or
when the batch must land in pinned memory, or in a DataLoader worker's shared memory anyway)
the batch is copied out and released at once.

Its parts: ``handshake.py`` (version check, token proof), ``outbox.py`` (frames the socket did
not take yet, deferred releases), ``recv_buffer.py`` (bytes read and not parsed yet),
``slot_maps.py`` (the slots it mapped, the low-water mark).
"""
from __future__ import annotations

import contextlib
import logging
import socket
from dataclasses import dataclass
from typing import Any

import torch

from data_service.contract import tensor_layout, compression
from data_service.contract.batch_id import BatchId
from data_service.protocol import framing
from data_service.errors import ProtocolError
from data_service.protocol.generated import pb
from data_service.protocol import integrity

from .buffers import BufferPool
from .handshake import handshake
from .outbox import WOULD_BLOCK, Outbox
from .recv_buffer import RecvBuffer
from .slot_maps import LowWater, SlotMaps

log = logging.getLogger(__name__)

LOWAT_MIN = 1 << 18  # payload rests at least this large are read in one wake-up (SO_RCVLOWAT)
LOWAT_CHECK_S = 0.5  # a socket waiting for its low-water mark is read anyway after this long
MAX_EVENTS_PER_READ = 64  # then the caller's loop gets its turn (timeouts, other servers) again


@dataclass(slots=True)
class Event:
    kind: str                 # "batch" | "error" | "down"
    conn: "BulkConnection"
    batch_id: BatchId | None = None  # "down": the batch whose payload failed or was arriving, if any
    batch: Any = None
    nbytes: int = 0
    error: pb.BatchError | None = None
    exc: BaseException | None = None


class _Payload:
    """A TCP batch whose bytes are still arriving."""

    __slots__ = ("header", "buf", "view", "got", "packed", "running")

    def __init__(self, header: pb.BatchHeader, buf: torch.Tensor, packed: bytearray | None,
                 running: integrity.Running | None) -> None:
        self.header = header
        self.buf = buf
        self.packed = packed  # compressed bytes land here first
        # ignore: numpy's stubs make an ndarray a Buffer only for Python >= 3.12
        self.view = memoryview(packed) if packed is not None else memoryview(buf.numpy())  # type: ignore[arg-type]
        self.got = 0
        self.running = running  # its checksum, summed as its bytes arrive (None: unchecked here)

    def arrived(self, k: int) -> None:
        """``k`` more bytes are in: sum them while the CPU cache holds them."""
        if self.running is not None and k:
            self.running.update(self.view[self.got:self.got + k])
        self.got += k


def _check_header(address: str, header: pb.BatchHeader, max_bytes: int, agreed_compression: str) -> None:
    """Refuse a batch header whose sizes or compression break what the connection agreed on.

    Raises:
        ProtocolError: over ``max_bytes``, another compression than ``agreed_compression``, or a TCP payload
        whose size differs from the batch's without a tensor_layout.
    """
    if header.payload_bytes > max_bytes or header.raw_bytes > max_bytes:
        raise ProtocolError(f"{address} sent a {header.payload_bytes}-byte batch; max_batch_bytes={max_bytes}")
    if header.compression and header.compression != agreed_compression:
        raise ProtocolError(f"{address} sent a {header.compression!r} batch after agreeing on {agreed_compression!r}")
    if not header.shm_path and not header.compression and header.payload_bytes != header.raw_bytes and header.payload_bytes:
        raise ProtocolError(f"{address}: payload_bytes={header.payload_bytes} != "
                            f"raw_bytes={header.raw_bytes} without compression")


def _check_payload(address: str, header: pb.BatchHeader, running: integrity.Running) -> None:
    """Refuse a payload whose bytes changed between the data worker and here.

    Raises:
        CorruptPayload: its checksum (``protocol.integrity``), summed as it arrived, differs from the
        one the worker wrote into its header (the connection then ends, and the batch is asked of a
        server again).
    """
    bad = running.mismatch()
    if bad is not None:
        which = BatchId.of(header.ref)
        raise CorruptPayload(f"{address} sent {which} whose header and {header.payload_bytes} "
                             f"payload bytes fail their {bad.checksum} ({bad.got:#010x} here, {bad.want:#010x} from the "
                             "data worker): damaged on the way; the batch is asked for again",
                             batch_id=which, expected=bad.want, got=bad.got)


class CorruptPayload(ProtocolError):
    """A batch's payload arrived with other bytes than its data worker wrote: ``batch_id`` (as its
    header says), ``expected`` (the data worker's CRC-32) and ``got`` (that of what arrived)."""

    def __init__(self, message: str, *, batch_id: BatchId, expected: int, got: int) -> None:
        super().__init__(message)
        self.batch_id, self.expected, self.got = batch_id, expected, got


class BulkConnection:
    """One data-plane connection; see the module docstring."""

    def __init__(self, address: str, host: str, port: int, token: str, client_id: str = "",
                 max_batch_bytes: int = 1 << 40, pin_memory: bool = False, shared_memory: bool = True,
                 tls_context=None, tls_server_name: str = "") -> None:
        self.address = address
        self._host, self._port = host, port
        self._token = token
        self._client_id = client_id
        self._max = max_batch_bytes
        self._sock: socket.socket | None = None
        self.closed = False
        self._pool = BufferPool(pin_memory)
        self._want_shm = shared_memory
        self._tls = tls_context
        self._tls_name = tls_server_name or host
        self.shm = False
        self.compression = ""
        self._maps = SlotMaps(address)
        self._rbuf = RecvBuffer(address)
        self._payload: _Payload | None = None
        self._outbox = Outbox()  # frames the socket did not take yet, releases waiting for a send
        self._lowat = LowWater()
        self.backlog = False  # read_events() stopped early: call it again without waiting for the socket

    # -- lifecycle
    def open(self, timeout: float = 10.0) -> None:
        """Connect and authenticate.

        Raises:
            OSError: not reachable. PermissionDeniedError / VersionMismatchError: refused.
        """
        sock = socket.create_connection((self._host, self._port), timeout=timeout)
        try:
            framing.tune(sock)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._tls_name)
            self.shm, self.compression = handshake(sock, self.address, self._token, self._client_id, self._want_shm)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = self._outbox.sock = sock

    def fileno(self) -> int:
        """The socket's descriptor (for a selector); -1 once closed."""
        return self._sock.fileno() if self._sock is not None else -1

    def close(self) -> None:
        """Close the socket and unmap slots no batch uses; the server retires what we still hold."""
        if self.closed:
            return
        self.closed = True
        self._outbox.drop_releases()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        self._payload = None
        self._maps.close()

    # -- sending
    def fetch(self, batches: list[BatchId]) -> None:
        """Ask for batches; raises OSError if the connection is gone."""
        self._request(pb.FetchRequest(batches=[b.ref() for b in batches]))

    def hint(self, batches: list[BatchId]) -> None:
        """Tell the server which batches will be asked for later (it may fetch their data ahead)."""
        self._request(pb.FetchRequest(prefetch=[b.ref() for b in batches]))

    def _request(self, request: pb.FetchRequest) -> None:
        if self._sock is None or self.closed:
            raise ConnectionError(f"connection to {self.address} is closed")
        self._outbox.send(framing.seal(pb.BulkFrame(fetch=request)), wait=True)

    @property
    def wants_write(self) -> bool:
        """Frames wait for the socket to take them (watch it for writability, then ``flush()``)."""
        return self._outbox.pending

    def flush(self) -> None:
        """Write deferred releases and whatever the socket did not take before; raises OSError
        when the connection is gone."""
        if self.closed or not self._outbox.pending:
            return
        self._outbox.send(b"", wait=True)

    def _dropped(self, release: pb.Release) -> None:
        """Finalizer of a zero-copy batch: send its ``Release`` now if the socket is free, else at the
        next ``flush()``. Runs wherever the last tensor died (``Outbox.release`` never waits)."""
        if self.closed:
            return  # the server retired the slot when the connection ended
        with contextlib.suppress(OSError):  # the connection is gone; the server retires the slot
            self._outbox.release(release, wait=False)

    # -- receiving
    def read_events(self) -> list[Event]:
        """Read what the socket has; returns the batches and errors completed, and a final
        ``"down"`` event (the connection is then closed) if it failed."""
        events: list[Event] = []
        self.backlog = False
        sock = self._sock
        if self.closed or sock is None:
            return events
        try:
            self._read(sock, events)
        except BaseException as exc:  # any failure ends this connection; the fetcher fails over
            culprit = exc.batch_id if isinstance(exc, CorruptPayload) else (
                BatchId.of(self._payload.header.ref) if self._payload is not None else None)
            events.append(Event("down", self, batch_id=culprit, exc=exc))
            self.close()
        # Bytes already read (or decrypted) wait in our buffers, where no selector sees them.
        self.backlog = len(events) >= MAX_EVENTS_PER_READ and not self.closed
        return events

    def _read(self, sock: socket.socket, events: list[Event]) -> None:
        # A plain socket that filled less of the frame buffer than asked is empty: stop there
        # instead of paying a failing recv (the selector reports what comes next). Payloads are
        # read until the socket says so: a large one keeps arriving while we copy. TLS keeps
        # records in its own buffer.
        plain = self._tls is None
        drained = False
        while len(events) < MAX_EVENTS_PER_READ:
            p = self._payload
            if p is not None:
                need = p.header.payload_bytes - p.got
                k = self._rbuf.take(p.view[p.got:], need)  # its first bytes came in with its header
                p.arrived(k)
                need -= k
                if need:
                    try:
                        k = sock.recv_into(p.view[p.got:], need)
                    except WOULD_BLOCK:
                        if plain and (need >= LOWAT_MIN or self._lowat.active):
                            self._lowat.set(sock, need)  # never above what is still to come
                        return
                    if k == 0:
                        raise framing.PeerClosed(f"{self.address} closed the connection after {p.got} of "
                                                 f"{p.header.payload_bytes} payload bytes")
                    p.arrived(k)
                    if p.got < p.header.payload_bytes:
                        continue
                self._payload = None
                if self._lowat.active:
                    self._lowat.set(sock, 1)
                p.view.release()
                buf = p.buf
                if p.running is not None:
                    _check_payload(self.address, p.header, p.running)
                if p.packed is not None:  # ignore: numpy's stubs make an ndarray a Buffer only for Python >= 3.12
                    compression.decompress_into(p.header.compression, p.packed,
                                                memoryview(buf.numpy()))  # type: ignore[arg-type]
                events.append(self._batch_event(p.header, buf))
                del p, buf
                continue
            frame = self._rbuf.frame()
            if frame is not None:
                self._on_frame(frame, events)
                continue
            if drained:
                return
            try:
                k, room = self._rbuf.fill(sock)
            except WOULD_BLOCK:
                return
            drained = plain and k < room

    @property
    def lowat(self) -> bool:
        """The socket is reported only once a large payload's rest is there (``LowWater``)."""
        return self._lowat.active

    def held_back(self, now: float) -> bool:
        """Waiting for its low-water mark for ``LOWAT_CHECK_S`` or longer: read it anyway (a mark
        the sender cannot reach must not stall the batch)."""
        return self._lowat.active and now - self._lowat.since >= LOWAT_CHECK_S

    def _on_frame(self, frame: pb.BulkFrame, events: list[Event]) -> None:
        kind = frame.WhichOneof("kind")
        if kind == "error":
            if not frame.error.HasField("ref"):  # about the connection (a damaged request): it ends
                raise ProtocolError(f"{self.address} ended the connection: {pb.ErrorKind.Name(frame.error.kind)}: "
                                    f"{frame.error.message}")
            events.append(Event("error", self, batch_id=BatchId.of(frame.error.ref), error=frame.error))
            return
        if kind != "batch":
            raise ProtocolError(f"{self.address}: unexpected {kind!r} frame")
        header = frame.batch
        _check_header(self.address, header, self._max, self.compression)
        if header.shm_path:
            events.append(self._batch_event(header, self._from_shm(header)))
            return
        buf = self._pool.get(header.raw_bytes)
        if not header.payload_bytes:
            events.append(self._batch_event(header, buf))
            return
        # TLS authenticates every record itself: the checksum is checked over plain TCP only
        running = integrity.Running(header) if self._tls is None and integrity.sealed(header) else None
        self._payload = _Payload(header, buf, bytearray(header.payload_bytes) if header.compression else None, running)

    def _batch_event(self, header: pb.BatchHeader, buf: torch.Tensor) -> Event:
        batch = tensor_layout.decode(header, buf, self._max)
        return Event("batch", self, batch_id=BatchId.of(header.ref), batch=batch, nbytes=header.payload_bytes)

    # -- shared memory
    def _from_shm(self, header: pb.BatchHeader) -> torch.Tensor:
        if not self.shm:
            raise ProtocolError(f"{self.address} sent a shared-memory batch without agreeing to it")
        return self._maps.batch(header, self._pool, self._dropped, self._release)

    def _release(self, release: pb.Release) -> None:
        self._outbox.release(release, wait=True)
