"""One consumer's data-plane connection on the server, driven by the data plane's event loop.

The connection's socket is non-blocking; the loop (dataplane.py) calls ``on_readable`` and
``on_writable``. Handshake (TLS when configured, challenge, token proof), then every
``FetchRequest`` frame becomes one task per batch for the worker pool; each finished batch is
written back from the worker's slot (header frame, then the slot's bytes, no copy; partial
writes resume where they stopped) in completion order, and its slot is freed once written.
The header goes out as the worker serialized it (the server never parses it). Frames are
written at the end of the loop's turn that queued them, and every frame waiting then leaves
in one ``sendmsg``: batches finished together cost the consumer one wake-up (send_queue.py).
When the consumer goes away its queued tasks are cancelled and held slots freed, so nothing
leaks and nothing it did not receive is lost: it asks again. A consumer that takes no bytes
for ``send_timeout_s`` while batches wait for it is dropped (its slots go back).

Shared-memory mode (consumer on this host): only the header is sent; the consumer reads the
slot in place and sends ``Release`` when done. A slot with a lease (``BatchHeader.shm_lease``)
stays the consumer's until it drops the batch (zero copy); slots still held when the
connection ends are retired, never rewritten, because the consumer may still be reading them.

A consumer whose hello says ``sealed`` ends every frame with its CRC-32 (request_reader.py). A
frame that fails it, does not parse, breaks the protocol, or stays incomplete too long (a damaged
length announces bytes that never come) is answered at once: an error frame without a ref names
the reason, then the connection closes, and the consumer asks again on a new one. Nothing a
damaged request might have meant is built.

Everything here runs on the loop's thread, except ``_on_result``, which the worker pool may
call from another thread: it hands the result to the loop.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import time
from typing import cast

from ..contract.batch_id import BatchId
from ..protocol import framing
from ..protocol.framing import frame_bytes
from ..errors import ProtocolError
from .request_reader import RequestReader
from .send_queue import SendQueue
from .session_host import SessionHost, hello_refusal
from ..protocol.version import PROTOCOL_VERSION
from ..protocol.generated import pb
from ..pool.tasks import Result, Task

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
MAX_OUTSTANDING = 4096  # batches one connection may have requested and not received
READ_CHUNK = 1 << 16


class Session:
    """One data-plane connection; see the module docstring."""

    def __init__(self, host: SessionHost[Session], sock: socket.socket, peer: str) -> None:
        self.host = host
        self._settings = host.settings
        self.sock = sock
        self.peer = peer
        self.client_id = "?"
        self.authenticated = False
        self.shm = False
        self.closed = False
        self.deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S  # unauthenticated until then
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._tls_done = not self._tls
        self._nonce = os.urandom(32)
        self._reader = RequestReader()
        self._out = SendQueue(sock, host.stats, lambda: host.flush_later(self), lambda on: host.want_write(self, on))
        self._close_when_sent = False
        self._tasks: dict[int, Task] = {}
        self._held: dict[BatchId, list[Result]] = {}  # shared-memory mode: sent, not yet released

    # -- lifecycle
    def start(self) -> None:
        """Begin the handshake (the loop has registered the socket for reading)."""
        self._tls_step()

    def close(self) -> None:
        """End the connection: cancel its tasks, free or retire its slots. Idempotent."""
        if self.closed:
            return
        self.closed = True
        tasks = list(self._tasks.values())
        self._tasks.clear()
        held = [r for rs in self._held.values() for r in rs]
        self._held.clear()
        unsent = self._out.close()
        self.host.cancel(tasks)
        for r in held:
            r.retire()  # the consumer may still map these (zero copy): never reuse them
        for r in unsent:
            r.release()
        self.host.closed(self)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    @property
    def idle(self) -> bool:
        """Nothing asked of it is unbuilt or unsent: what a graceful shutdown waits for. Batches the
        consumer holds (shared memory, not yet released) do not count: its mappings keep their
        bytes whatever this server does next, and it may hold them for as long as it likes (a
        connection kept open between epochs, the last batches of a loader's prefetch)."""
        return not self._tasks and not self._out

    def check_deadlines(self, now: float) -> None:
        """Drop a peer that did not finish the handshake in time, or took no bytes for send_timeout_s."""
        if not self.authenticated and now > self.deadline:
            log.warning("data plane: dropping %s: no handshake within %.0fs", self.peer, HANDSHAKE_TIMEOUT_S)
            self.close()
        elif self._out and now - self._out.progress_at > self._settings.send_timeout_s:
            log.warning("data plane: dropping %s (%s): took no data for %.0fs", self.peer, self.client_id,
                        self._settings.send_timeout_s)
            self.close()
        elif not self._close_when_sent and (why := self._reader.stalled(now)):
            self._end(why)

    # -- events from the loop
    def on_readable(self) -> None:
        try:
            if not self._tls_done:
                self._tls_step()
                if not self._tls_done:
                    return
            self._read()
        except (framing.PeerClosed, ConnectionError, OSError):
            self.close()
        except ProtocolError as exc:
            self._end(str(exc))

    def _end(self, reason: str) -> None:
        """The consumer broke the protocol (a damaged frame, most likely): it is told why, in an
        error frame without a ref, then the connection closes; nothing more it sent is read,
        nothing more is built for it. After the handshake only a sealed consumer is told (one
        from before sealing would take the error for one about a batch); during it every
        consumer reads an error as the handshake's answer."""
        log.warning("data plane: dropping %s (%s): %s", self.peer, self.client_id, reason)
        if self.closed or not self._tls_done or (self.authenticated and not self._reader.sealed):
            self.close()
            return
        self._close_when_sent = True
        self.host.cancel(list(self._tasks.values()))
        self._tasks.clear()
        self._refuse(pb.BAD_REQUEST, reason)

    def on_writable(self) -> None:
        if not self._tls_done:
            self.on_readable()  # the TLS handshake wants to write
            return
        self._flush()

    # -- reading
    def _tls_step(self) -> None:
        """The TLS handshake's next step (none without TLS); once it is done, the challenge."""
        try:
            if self._tls:
                cast(ssl.SSLSocket, self.sock).do_handshake()  # a TLS session's socket is wrapped
        except ssl.SSLWantReadError:
            self._out.want_write(False)
            return
        except ssl.SSLWantWriteError:
            self._out.want_write(True)
            return
        except (ssl.SSLError, OSError) as exc:
            raise ProtocolError(f"TLS handshake failed: {exc}") from None
        self._tls_done = True
        self._out.want_write(False)
        challenge = pb.Challenge(server_version=PROTOCOL_VERSION, nonce=self._nonce)
        self._out.put(frame_bytes(pb.BulkFrame(challenge=challenge)))

    def _read(self) -> None:
        while not self.closed:
            try:
                data = self.sock.recv(READ_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            if not data:
                raise framing.PeerClosed(f"{self.peer} closed the connection")
            if self._close_when_sent:
                continue  # refused, or ending: what else it sends is not read
            self._reader.buf += data
            for frame in self._reader.frames(lambda: self.authenticated):
                self._on_frame(frame)
                if self.closed or self._close_when_sent:
                    break  # refused, or ending: the rest is not read
            if len(data) < READ_CHUNK and not self._tls:
                return  # the socket is empty: no failing recv (the loop reports what comes next)

    def _on_frame(self, frame: pb.BulkFrame) -> None:
        kind = frame.WhichOneof("kind")
        if not self.authenticated:
            if kind != "hello":
                raise ProtocolError(f"expected a hello frame, got {kind!r}")
            self._on_hello(frame.hello)
            return
        if kind == "release" and self.shm:
            which = BatchId.of(frame.release.ref)
            held = self._held.get(which, [])
            inode = frame.release.shm_inode
            # the copy in the named slot (no inode, an older client: the oldest): the consumer may
            # hold two of one batch (asked for again while it kept the first), the other still in use
            at = next((k for k, r in enumerate(held) if not inode or r.shm_inode == inode), None)
            if at is None:
                raise ProtocolError(f"release of batch {which.index} (epoch {which.epoch}) in slot inode "
                                    f"{inode} that is not held")
            result = held.pop(at)
            if not held:
                del self._held[which]
            result.release()
            return
        if kind != "fetch":
            raise ProtocolError(f"expected fetch frames, got {kind!r}")
        for which in map(BatchId.of, frame.fetch.prefetch):  # hints: fetch data ahead, build and answer nothing
            if which.index < self._settings.num_batches and which.epoch < 1 << 62:
                self.host.prefetch(which)
        for which in map(BatchId.of, frame.fetch.batches):
            if not which.index < self._settings.num_batches or which.epoch >= 1 << 62:
                self._queue_error(which, pb.OUT_OF_RANGE,
                                  f"batch {which.index} of epoch {which.epoch} is outside the plan "
                                  f"(valid batch indices 0..{self._settings.num_batches - 1})")
                continue
            if self.host.shutting_down():
                self._queue_error(which, pb.SHUTTING_DOWN, "data server is shutting down; ask another server")
                continue
            if len(self._tasks) + len(self._out) >= MAX_OUTSTANDING:
                raise ProtocolError(f"more than {MAX_OUTSTANDING} outstanding batch requests")
            self.host.prefetch(which)
            task = Task(which, self._on_result, owner=self)
            self._tasks[id(task)] = task  # before submit: the pool may answer at once
            self.host.submit(task)
            if self.closed:
                return

    def _on_hello(self, hello: pb.BulkHello) -> None:
        self.client_id = hello.client_id or self.peer
        if (refused := hello_refusal(hello, self._settings, self._nonce)) is not None:
            if refused[0] == pb.PERMISSION_DENIED:
                self.host.count_auth_failure()
                log.warning("data plane: wrong job token from %s (%s)", self.peer, self.client_id)
            self._refuse(*refused)
            return
        self.shm = bool(self._settings.shared_memory and hello.accept_shm and hello.host_key
                        and hello.host_key == framing.host_key())
        framing.set_send_timeout(self.sock, self._settings.send_timeout_s)
        self.authenticated = True
        self.host.stats.consumer_connected()
        welcome = pb.Welcome(server_id=self._settings.server_id, compression=self._settings.compression, shm=self.shm)
        self._out.put(frame_bytes(pb.BulkFrame(welcome=welcome)))

    def _refuse(self, kind: pb.ErrorKind, message: str) -> None:
        self._close_when_sent = True
        self._out.put(frame_bytes(pb.BulkFrame(error=pb.BatchError(kind=kind, message=message, sample_index=-1))))

    # -- results
    def _queue_error(self, which: BatchId, kind: pb.ErrorKind, message: str) -> None:
        error = pb.BatchError(ref=which.ref(), kind=kind, message=message, sample_index=-1)
        self._out.put(frame_bytes(pb.BulkFrame(error=error)))

    def _on_result(self, result: Result) -> None:
        """Called by the worker pool, on the loop's thread or another one."""
        self.host.call_soon(self._deliver, result)

    def _deliver(self, result: Result) -> None:
        self._tasks.pop(id(result.task), None)
        if self.closed or self._close_when_sent:
            result.release()
            return
        if result.error is not None:
            self._out.put(frame_bytes(pb.BulkFrame(error=result.error)))
            return
        figures = (result.raw_bytes, result.payload_bytes, result.compress_s)
        if self.shm and result.shm_path:  # a batch window's copy has no slot: it goes as TCP bytes
            extra = pb.BatchHeader(shm_path=result.shm_path, shm_size=result.shm_size, shm_inode=result.shm_inode,
                                   shm_lease=result.lease()).SerializeToString()
            self._held.setdefault(result.task.batch, []).append(result)  # until Release
            self._out.put(framing.batch_frame(result.header_bytes, extra), figures=figures)
        else:
            self._out.put(framing.batch_frame(result.header_bytes), result.payload, result, figures)

    # -- writing (send_queue.py)
    def flush(self) -> None:
        """Write what waits (the loop calls this at the end of the turn that queued it)."""
        self._out.flush_due = False
        if not self._out.writing and not self.closed:
            self._flush()

    def _flush(self) -> None:
        if not self._out.write() or (self._close_when_sent and not self._out):  # the socket failed, or all is sent
            self.close()
