"""The consumer's data-plane connection to one server.

``open()`` does the handshake (version check, token proof); ``fetch()`` asks
for batches; a reader thread receives each batch straight into a pooled buffer
(one copy, kernel to user; pinned memory when asked) and posts decoded
batches, errors and its own death to a shared event queue.

When the server runs on this host, batches stay in its shared-memory slots. A
slot that comes with a lease is mapped and the batch's tensors are views of it
(zero copy); when the last of them is gone a finalizer sends the slot's
``Release`` (through a small sender thread when the socket is busy). Without a lease (or when the batch must
land in pinned memory, or in a DataLoader worker's shared memory anyway) the
batch is copied out and released at once.
"""
from __future__ import annotations

import logging
import mmap
import os
import queue
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from data_service import codec, compression, framing
from data_service.errors import PermissionDeniedError, ProtocolError, VersionMismatchError
from data_service.version import PROTOCOL_VERSION, compatible, mismatch_message
from data_service.wire import pb

from .buffers import BufferPool

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 5.0  # closing waits this long for the connection's threads


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
                 client_version: str = PROTOCOL_VERSION, shared_memory: bool = True, tls_context=None,
                 tls_server_name: str = "") -> None:
        self.address = address
        self._host, self._port = host, port
        self._token = token
        self._events = events
        self._client_id = client_id
        self._max = max_batch_bytes
        self._pin = pin_memory
        self._version = client_version
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._send_lock = threading.Lock()
        self.closed = False
        self.bytes_received = 0
        self._pool = BufferPool(pin_memory)
        self._want_shm = shared_memory
        self._tls = tls_context
        self._tls_name = tls_server_name or host
        self.shm = False
        self.codec = ""
        self._maps: dict[str, tuple[int, int, mmap.mmap]] = {}  # path -> (inode, size, map)
        self._releases: queue.SimpleQueue = queue.SimpleQueue()  # refs of dropped zero-copy batches

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
            frame = framing.recv_frame(sock)
            if frame.WhichOneof("kind") != "challenge":
                raise ProtocolError(f"{self.address}: expected a challenge, got {frame.WhichOneof('kind')!r}")
            if not compatible(self._version, frame.challenge.server_version):
                raise VersionMismatchError(f"{self.address}: " + mismatch_message(self._version, frame.challenge.server_version))
            hello = pb.BulkHello(client_version=self._version, client_id=self._client_id,
                                 proof=framing.token_proof(self._token, frame.challenge.nonce),
                                 accept_codecs=compression.available(), accept_shm=self._want_shm,
                                 host_key=framing.host_key() if self._want_shm else "")
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
            self.shm, self.codec = reply.welcome.shm, reply.welcome.codec
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._threads = [threading.Thread(target=self._read_loop, name=f"recv-{self.address}", daemon=True)]
        if self.shm:
            self._threads.append(threading.Thread(target=self._release_loop, name=f"release-{self.address}",
                                                  daemon=True))
        for t in self._threads:
            t.start()

    def fetch(self, refs: list[pb.BatchRef]) -> None:
        """Ask for batches; raises OSError if the connection is gone."""
        if self._sock is None or self.closed:
            raise ConnectionError(f"connection to {self.address} is closed")
        with self._send_lock:
            framing.send_frame(self._sock, pb.BulkFrame(fetch=pb.FetchRequest(batches=refs)))

    def close(self) -> None:
        if not self.closed:
            self._releases.put(None)  # stops the release thread; the server retires what we still hold
        self.closed = True
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        # Wait for our threads (not from one of them): one still dropping a tensor while the
        # interpreter exits is killed inside torch's destructor, and the process aborts
        # ("terminate called without an active exception").
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    log.warning("thread %s did not end within %.0fs of closing the connection", t.name,
                                JOIN_TIMEOUT_S)

    def _map_slot(self, header: pb.BatchHeader) -> mmap.mmap:
        """Map the server's slot named in ``header`` (cached per slot)."""
        if not self.shm:
            raise ProtocolError(f"{self.address} sent a shared-memory batch without agreeing to it")
        path, size, inode = header.shm_path, header.shm_size, header.shm_inode
        if not path.startswith("/proc/") or header.payload_bytes > size:
            raise ProtocolError(f"{self.address}: bad shared-memory reference {path!r} ({header.payload_bytes} of {size} bytes)")
        cached = self._maps.get(path)
        if cached is not None and cached[:2] == (inode, size):
            return cached[2]
        self._maps.pop(path, None)  # unmapped once no zero-copy batch uses it
        fd = os.open(path, os.O_RDWR)  # writable: users may change batch tensors in place
        try:
            if inode and os.fstat(fd).st_ino != inode:
                # The slot was retired and its descriptor number reused before we got here.
                raise ProtocolError(f"{self.address}: shared-memory slot {path!r} was replaced before it was read")
            m = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._maps[path] = (inode, size, m)
        return m

    def _zero_copy(self, header: pb.BatchHeader) -> bool:
        # Pinned buffers and a loader worker's shared storage need their own copy anyway.
        return (header.shm_lease and not header.codec and header.payload_bytes > 0 and not self._pool.pin_memory
                and get_worker_info() is None)

    def _from_shm(self, header: pb.BatchHeader):
        """Shared-memory mode: the batch's bytes as a uint8 tensor (a view of the slot, or a copy)."""
        slot = self._map_slot(header)
        if self._zero_copy(header):
            view = memoryview(slot)[:header.payload_bytes]
            buf = torch.frombuffer(view, dtype=torch.uint8)  # keeps ``view`` alive while any tensor uses it
            weakref.finalize(view, self._dropped, header.ref)
            return buf
        buf = self._pool.get(header.raw_bytes)
        src = memoryview(slot)[:header.payload_bytes]
        try:
            if header.codec:
                compression.decompress_into(header.codec, src, memoryview(buf.numpy()))
            elif header.payload_bytes:
                np.copyto(buf.numpy(), np.frombuffer(src, dtype=np.uint8))
        finally:
            src.release()
        self._send_release(header.ref)
        return buf

    def _from_socket(self, sock, header: pb.BatchHeader):
        """TCP mode: receive the batch's bytes (decompressing if needed) into a pooled buffer."""
        buf = self._pool.get(header.raw_bytes)
        if header.codec:
            packed = bytearray(header.payload_bytes)
            framing.recv_into(sock, memoryview(packed))
            compression.decompress_into(header.codec, packed, memoryview(buf.numpy()))
        elif header.payload_bytes:
            if header.payload_bytes != header.raw_bytes:
                raise ProtocolError(f"{self.address}: payload_bytes={header.payload_bytes} != "
                                    f"raw_bytes={header.raw_bytes} without a codec")
            framing.recv_into(sock, memoryview(buf.numpy()))
        return buf

    def _dropped(self, ref: pb.BatchRef) -> None:
        """Finalizer of a zero-copy batch: release its slot now if the socket is free, else via the thread.

        Runs wherever the last tensor died, possibly inside a send on this thread, so it never
        waits for the send lock (not re-entrant); ``SimpleQueue.put`` is safe in finalizers.
        """
        if self.closed:
            return  # the server retired the slot when the connection ended
        try:
            if not self._send_release(ref, wait=False):
                self._releases.put(ref)
        except OSError:
            pass  # the connection is gone; the server retires the slot

    def _send_release(self, ref: pb.BatchRef, wait: bool = True) -> bool:
        """Send ``Release``; with ``wait=False`` only if the send lock is free (returns whether sent)."""
        if not self._send_lock.acquire(blocking=wait):
            return False
        try:
            framing.send_frame(self._sock, pb.BulkFrame(release=pb.Release(ref=ref)))
        finally:
            self._send_lock.release()
        return True

    def _release_loop(self) -> None:
        """Send ``Release`` for zero-copy batches the consumer has dropped."""
        while True:
            ref = self._releases.get()
            if ref is None or self.closed:
                return
            try:
                self._send_release(ref)
            except OSError:
                return  # the connection is gone; the server retired the slot

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
                    if header.codec and header.codec != self.codec:
                        raise ProtocolError(f"{self.address} sent a {header.codec!r} batch after agreeing on {self.codec!r}")
                    buf = self._from_shm(header) if header.shm_path else self._from_socket(sock, header)
                    self.bytes_received += header.payload_bytes
                    batch = codec.decode(header, buf, self._max)
                    self._events.put(Event("batch", self, ref=header.ref, batch=batch, nbytes=header.payload_bytes))
                    del batch, buf  # the consumer's thread, not this one, should drop the last reference
                elif kind == "error":
                    self._events.put(Event("error", self, ref=frame.error.ref, error=frame.error))
                else:
                    raise ProtocolError(f"{self.address}: unexpected {kind!r} frame")
        except BaseException as exc:  # any failure ends this connection; the fetcher fails over
            if not self.closed:
                self._events.put(Event("down", self, exc=exc))
            self.close()
        finally:
            for *_, m in self._maps.values():
                try:
                    m.close()
                except BufferError:
                    pass  # zero-copy batches still use it: unmapped when they are gone
            self._maps.clear()
