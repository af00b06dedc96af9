"""Helpers of the fault, hostile-input and soak suites.

Repetitions: each fault runs ``REPS`` times (``HETERO_FAULT_REPS``, default 1; ``-m slow`` tests use
``SLOW_REPS``, default 5). Servers, the fault proxy and the accounting of lost/duplicated/corrupt
batches through the audit log come from ``hetero.testing``, so the tests and the soak count the
same way.
"""
from __future__ import annotations

import os
import queue
import socket
import threading
import time
import weakref
from typing import Callable

from conftest import TOKEN
from data_service.protocol import framing
from data_service.protocol.version import PROTOCOL_VERSION
from data_service.protocol.generated import pb

REPS = int(os.environ.get("HETERO_FAULT_REPS", "1"))
SLOW_REPS = int(os.environ.get("HETERO_FAULT_SLOW_REPS", "5"))


def assert_exactly_once(acc: dict, expected: int | None = None) -> None:
    bad = {k: acc[k] for k in ("lost", "duplicated", "corrupt", "foreign") if acc[k]}
    assert not bad, (bad, acc["lost_examples"], acc["duplicated_examples"])
    if expected is not None:
        assert acc["delivered"] == expected, acc


def wait_until(pred: Callable[[], bool], timeout: float, what: str, poll: float = 0.1) -> None:
    """Poll ``pred`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(poll)
    raise AssertionError(f"not within {timeout}s: {what}")


_READ_AHEAD: "weakref.WeakKeyDictionary[object, list]" = weakref.WeakKeyDictionary()


def next_event(conn, timeout: float):
    """The next event of one consumer ``BulkConnection`` alone, driven the way the fetcher's selector
    drives it (flush, wait for the socket, read; a held-back payload rest is read anyway).

    Raises:
        TimeoutError: nothing arrived within ``timeout`` seconds.
    """
    import selectors

    from dnn_worker.transport.connection import LOWAT_CHECK_S

    deadline = time.monotonic() + timeout
    pending = _READ_AHEAD.setdefault(conn, [])  # events read beyond the one asked for, for the next call
    with selectors.DefaultSelector() as sel:
        sel.register(conn.fileno(), selectors.EVENT_READ)
        while not pending:
            if conn.closed:
                raise ConnectionError(f"connection to {conn.address} is closed")
            conn.flush()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no event from {conn.address} within {timeout}s")
            if conn.backlog or sel.select(min(left, LOWAT_CHECK_S) if conn.lowat else left) or conn.lowat:
                pending.extend(conn.read_events())
    return pending.pop(0)


def stats(address: str, token: str = TOKEN):
    from dnn_worker import ControlClient

    with ControlClient(address, token) as ctl:
        return ctl.stats(timeout=5.0)


def wait_clean(address: str, token: str = TOKEN, timeout: float = 20.0) -> None:
    """The server holds no stream, slot or queued task any more."""
    last = {}

    def clean() -> bool:
        s = stats(address, token)
        last.update(active=s.active_streams, slots=s.slots_in_use, queue=s.queue_depth)
        return (s.active_streams, s.slots_in_use, s.queue_depth) == (0, 0, 0)

    try:
        wait_until(clean, timeout, "server back to 0 streams, 0 slots, 0 queued")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last}") from None


def bulk_port(address: str, token: str = TOKEN) -> int:
    from dnn_worker import ControlClient

    with ControlClient(address, token) as ctl:
        return ctl.hello().bulk_port


# ------------------------------------------------------------------ raw data-plane client

class RawBulk:
    """A hand-driven data-plane client: send any frame, read raw replies."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)

    def challenge(self) -> pb.Challenge:
        frame = framing.recv_frame(self.sock)
        assert frame.WhichOneof("kind") == "challenge", frame
        return frame.challenge

    def login(self, token: str = TOKEN, version: str = PROTOCOL_VERSION, shm: bool = False) -> pb.BulkFrame:
        ch = self.challenge()
        send_frame(self.sock, pb.BulkFrame(hello=pb.BulkHello(
            client_version=version, proof=framing.token_proof(token, ch.nonce), client_id="raw",
            accept_shm=shm, host_key=framing.host_key() if shm else "")))
        return framing.recv_frame(self.sock)

    def fetch(self, refs) -> None:
        send_frame(self.sock, pb.BulkFrame(fetch=pb.FetchRequest(batches=list(refs))))

    def read_result(self) -> pb.BulkFrame:
        """One reply frame; a batch's payload is read and dropped."""
        frame = framing.recv_frame(self.sock)
        if frame.WhichOneof("kind") == "batch" and frame.batch.payload_bytes:
            framing.recv_into(self.sock, memoryview(bytearray(frame.batch.payload_bytes)))
        return frame

    def closed_by_peer(self, timeout: float = 15.0) -> bool:
        """True when the server closes the connection (EOF/reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# ------------------------------------------------------------------ fake data server

class FakeBulkServer:
    """A hostile data-plane server: does the handshake, then sends what ``script`` says.

    ``serve(frames)`` queues one connection's script: a list of ``bytes`` chunks sent after the
    Welcome frame (then the socket is closed). Used to fuzz the consumer's decoder through a
    real socket.
    """

    def __init__(self) -> None:
        self._lst = socket.socket()
        self._lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lst.bind(("127.0.0.1", 0))
        self._lst.listen(16)
        self.port = self._lst.getsockname()[1]
        self._scripts: queue.Queue = queue.Queue()
        self._closed = False
        self.errors: list[BaseException] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def serve(self, chunks: list[bytes], linger_s: float = 0.0, pause_s: float = 0.0) -> None:
        """Queue a script; ``pause_s`` between chunks makes the consumer read them one by one."""
        self._scripts.put((chunks, linger_s, pause_s))

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._lst.accept()
            except OSError:
                return
            try:
                chunks, linger, pause = self._scripts.get(timeout=10)
            except queue.Empty:
                sock.close()
                continue
            threading.Thread(target=self._run, args=(sock, chunks, linger, pause), daemon=True).start()

    def _run(self, sock: socket.socket, chunks: list[bytes], linger: float, pause: float = 0.0) -> None:
        try:
            sock.settimeout(10)
            send_frame(sock, pb.BulkFrame(challenge=pb.Challenge(server_version=PROTOCOL_VERSION, nonce=b"n" * 32)))
            framing.recv_frame(sock)  # the client's hello; any proof is accepted
            send_frame(sock, pb.BulkFrame(welcome=pb.Welcome(server_id="fake")))
            for c in chunks:
                sock.sendall(c)
                time.sleep(pause)
            if linger:
                time.sleep(linger)
        except OSError:
            pass
        except BaseException as exc:  # pragma: no cover - a bug in the fake itself
            self.errors.append(exc)
        finally:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._closed = True
        self._lst.close()


def frame_bytes(frame: pb.BulkFrame) -> bytes:
    head = frame.SerializeToString()
    return framing._LEN.pack(len(head)) + head


def send_frame(sock: socket.socket, frame: pb.BulkFrame) -> None:
    sock.sendall(framing.frame_bytes(frame))


def slow_header_parse(monkeypatch, seconds: Callable[[pb.BatchHeader], float]) -> None:
    """Make the worker pool's dispatcher sleep ``seconds(header)`` after reading each "done" message.

    That widens the window between "a worker says done" and "the server takes the batch", where
    races with other threads (assigning tasks, a worker dying) would show."""
    from data_service.pool import messages

    recv = messages.MessageConnection.recv

    def slow_recv(conn):
        msg = recv(conn)
        if isinstance(msg, messages.DoneMsg):
            time.sleep(seconds(pb.BatchHeader.FromString(msg.header)))
        return msg

    monkeypatch.setattr(messages.MessageConnection, "recv", slow_recv)
