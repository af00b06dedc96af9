"""One consumer's data-plane connection on the server.

A reader thread takes ``FetchRequest`` frames and submits one task per batch
to the worker pool; a sender thread writes finished batches back (header frame,
then the slot's bytes, no copy) in completion order and frees each slot. When
the consumer goes away its queued tasks are cancelled and held slots freed, so
nothing leaks and nothing it did not receive is lost: it asks again.

Shared-memory mode (consumer on this host): only the header is sent; the
consumer reads the slot in place and sends ``Release`` when done. A slot with a
lease (``BatchHeader.shm_lease``) stays the consumer's until it drops the batch
(zero copy); slots still held when the connection ends are retired, never
rewritten, because the consumer may still be reading them.
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING

from . import framing
from .errors import ProtocolError
from .version import PROTOCOL_VERSION, compatible, mismatch_message
from .wire import pb
from .workers import Result, Task

if TYPE_CHECKING:
    from .server import DataServer

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
MAX_OUTSTANDING = 4096  # batches one connection may have requested and not received


class Session:
    def __init__(self, server: "DataServer", sock: socket.socket, peer: str) -> None:
        self.server = server
        self.sock = sock
        self.peer = peer
        self.client_id = "?"
        self._outbox: queue.Queue[Result | None] = queue.Queue()
        self._tasks: dict[int, Task] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.authenticated = False
        self.shm = False
        self._held: dict[tuple[int, int, int], list[Result]] = {}  # shared-memory mode: sent, not yet released

    # -- lifecycle
    def run(self) -> None:
        """Handshake, then serve until the peer leaves (runs on its own thread)."""
        try:
            if not self._handshake():
                return
            sender = threading.Thread(target=self._send_loop, name=f"send-{self.peer}", daemon=True)
            sender.start()
            self._read_loop()
        except (framing.PeerClosed, ConnectionError, OSError):
            pass
        except ProtocolError as exc:
            log.warning("data plane: dropping %s (%s): %s", self.peer, self.client_id, exc)
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:  # after this block nothing is added to _held or the outbox
            if self._closed.is_set():
                return
            self._closed.set()
            tasks = list(self._tasks.values())
            self._tasks.clear()
            held = [r for rs in self._held.values() for r in rs]
            self._held.clear()
        self.server.pool.cancel(tasks)
        for r in held:
            r.retire()  # the consumer may still map these (zero copy): never reuse them
        self._outbox.put(None)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.server.session_closed(self)

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._tasks and not self._held and self._outbox.empty()

    # -- protocol
    def _handshake(self) -> bool:
        self.sock.settimeout(HANDSHAKE_TIMEOUT_S)
        if hasattr(self.sock, "do_handshake"):
            try:
                self.sock.do_handshake()
            except (ssl.SSLError, OSError) as exc:
                raise ProtocolError(f"TLS handshake failed: {exc}") from None
        nonce = os.urandom(32)
        framing.send_frame(self.sock, pb.BulkFrame(challenge=pb.Challenge(server_version=PROTOCOL_VERSION, nonce=nonce)))
        frame = framing.recv_frame(self.sock)
        if frame.WhichOneof("kind") != "hello":
            raise ProtocolError(f"expected a hello frame, got {frame.WhichOneof('kind')!r}")
        hello = frame.hello
        self.client_id = hello.client_id or self.peer
        if not compatible(hello.client_version, PROTOCOL_VERSION):
            self._send_error(pb.VERSION_MISMATCH, mismatch_message(hello.client_version, PROTOCOL_VERSION))
            return False
        if not framing.hmac.compare_digest(hello.proof, framing.token_proof(self.server.token, nonce)):
            self.server.count_auth_failure()
            log.warning("data plane: wrong job token from %s (%s)", self.peer, self.client_id)
            self._send_error(pb.PERMISSION_DENIED, "missing or wrong job token")
            return False
        codec = self.server.options.compression
        if codec and codec not in hello.accept_codecs:
            self._send_error(pb.BAD_REQUEST, f"this server compresses batches with {codec}, the client cannot decode "
                                             f"it: pip install 'hetero-data-service[compress]' on the consumer")
            return False
        self.shm = bool(self.server.options.shared_memory and hello.accept_shm and hello.host_key
                        and hello.host_key == framing.host_key())
        framing.send_frame(self.sock, pb.BulkFrame(welcome=pb.Welcome(server_id=self.server.server_id, codec=codec,
                                                                      shm=self.shm)))
        self.sock.settimeout(None)
        framing.set_send_timeout(self.sock, self.server.options.send_timeout_s)
        self.authenticated = True
        self.server.consumer_connected()
        return True

    def _send_error(self, kind: int, message: str, ref: pb.BatchRef | None = None) -> None:
        err = pb.BatchError(kind=kind, message=message, sample_index=-1)
        if ref is not None:
            err.ref.CopyFrom(ref)
        framing.send_frame(self.sock, pb.BulkFrame(error=err))

    def _read_loop(self) -> None:
        cfg = self.server.plan
        while not self._closed.is_set():
            frame = framing.recv_frame(self.sock)
            kind = frame.WhichOneof("kind")
            if kind == "release" and self.shm:
                ref = frame.release.ref
                with self._lock:
                    held = self._held.get((ref.seed, ref.epoch, ref.index))
                    result = held.pop(0) if held else None
                    if held == []:
                        del self._held[(ref.seed, ref.epoch, ref.index)]
                if result is None:
                    raise ProtocolError(f"release of batch {ref.index} (epoch {ref.epoch}) that is not held")
                result.release()
                continue
            if kind != "fetch":
                raise ProtocolError(f"expected fetch frames, got {kind!r}")
            for ref in frame.fetch.batches:
                if not ref.index < cfg.num_batches or ref.epoch >= 1 << 62:
                    self._queue_error(ref, pb.OUT_OF_RANGE,
                                      f"batch {ref.index} of epoch {ref.epoch} is outside the plan "
                                      f"(valid batch indices 0..{cfg.num_batches - 1})")
                    continue
                if self.server.shutting_down:
                    self._queue_error(ref, pb.SHUTTING_DOWN, "data server is shutting down; ask another server")
                    continue
                task = Task(ref.seed, ref.epoch, ref.index, self._on_result)
                with self._lock:
                    if len(self._tasks) >= MAX_OUTSTANDING:
                        raise ProtocolError(f"more than {MAX_OUTSTANDING} outstanding batch requests")
                    self._tasks[id(task)] = task  # before submit: the pool may answer at once
                self.server.pool.submit(task)

    def _queue_error(self, ref: pb.BatchRef, kind: int, message: str) -> None:
        err = pb.BatchError(ref=ref, kind=kind, message=message, sample_index=-1)
        self._outbox.put(Result(Task(ref.seed, ref.epoch, ref.index, lambda r: None), error=err))

    def _on_result(self, result: Result) -> None:
        """Called by the pool's thread: hand the result to the sender."""
        with self._lock:
            self._tasks.pop(id(result.task), None)
            closed = self._closed.is_set()
            if not closed:
                self._outbox.put(result)
        if closed:
            result.release()

    def _send_loop(self) -> None:
        stats = self.server.stats
        while True:
            result = self._outbox.get()
            if result is None:
                break
            try:
                if result.error is not None:
                    framing.send_frame(self.sock, pb.BulkFrame(error=result.error))
                    continue
                t0 = time.perf_counter()
                header = result.header
                if self.shm:
                    header.shm_path, header.shm_size = result.shm_path, result.shm_size
                    header.shm_inode = result.shm_inode
                    header.shm_lease = not header.codec and result.lease()
                    ref = header.ref
                    with self._lock:
                        closed = self._closed.is_set()
                        if not closed:
                            self._held.setdefault((ref.seed, ref.epoch, ref.index), []).append(result)
                    if closed:  # close() already retired what was held; this one too
                        result.retire()
                        result = None
                        break
                    result = None  # held until the client's Release, or retired by close()
                    sent = framing.send_frame(self.sock, pb.BulkFrame(batch=header))
                else:
                    sent = framing.send_frame(self.sock, pb.BulkFrame(batch=header), result.payload)
                stats.record_sent(sent, header.raw_bytes, time.perf_counter() - t0, header.payload_bytes,
                                  header.compress_s)
            except OSError:
                break
            finally:
                if result is not None:
                    result.release()
        self.close()  # a failed send ends the session; the reader sees it too
        while True:  # drain: free slots of results we will never send
            try:
                result = self._outbox.get_nowait()
            except queue.Empty:
                return
            if result is not None:
                result.release()


