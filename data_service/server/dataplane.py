"""The data plane's event loop: one thread for the listener, every session and the worker pool.

One ``selectors`` loop watches the data-plane listener, every consumer connection (session.py)
and the worker pool's pipes and process sentinels (pool/worker_pool.py). A worker's "done" message,
the write of that batch to its consumer and the next task for the freed slot all happen on
this thread, without a hand-over; the number of threads does not grow with the number of
consumers. Frames queued during one turn of the loop are written at its end, after the
workers have their next tasks: a worker starts building before the consumer is woken. Other
threads (gRPC calls, worker replacement, shutdown) reach the loop through ``call_soon``.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable, Protocol

from ..protocol import framing
from ..protocol.waker import Waker
from .session import Session
from .session_host import SessionSettings
from ..pool.tasks import Task
from ..pool.worker_pool import WorkerPool

if TYPE_CHECKING:
    from ..contract.batch_id import BatchId
    from .stats import ServerStats

log = logging.getLogger(__name__)

TICK_S = 0.25          # deadlines (handshake, send timeout) are checked this often
ACCEPT_PAUSE_S = 0.1   # after accept() fails (out of descriptors): let sessions end first
ACCEPT_BATCH = 64      # connections taken per wake-up, so a flood cannot starve the rest

_ACCEPT, _WAKE, _POOL = "accept", "wake", "pool"


class Server(Protocol):
    """What the data plane passes on to its server (data_server.DataServer) for the sessions."""

    stats: "ServerStats"
    shutting_down: bool  # new requests are refused

    def count_auth_failure(self) -> None: ...
    def prefetch(self, batch: BatchId) -> None: ...


class DataPlane:
    """Serves consumer connections on ``listener``; see the module docstring. It is its
    sessions' host (``session_host.SessionHost``).

    Args:
        listener: a bound, listening TCP socket.
        pool: the worker pool; its pipes are read on this loop (start it with ``own_thread=False``).
        settings: what every session follows.
        server: the data server, for its stats, whether it is shutting down, and its prefetcher.
        tls_context: server-side ``ssl.SSLContext``, or None for plain TCP.
        builds: what the sessions' requests go to (``submit``, ``cancel``): the batch window
            (shared_builds.SharedBuilds), or None for the pool itself.
    """

    def __init__(self, listener: socket.socket, pool: WorkerPool, settings: SessionSettings,
                 server: Server, tls_context=None, builds=None) -> None:
        self._listener = listener
        self._pool = pool
        self._builds = builds if builds is not None else pool
        self._server = server
        self.settings = settings
        self.stats = server.stats
        self._tls = tls_context
        self._sel = selectors.DefaultSelector()
        self._waker = Waker()  # calls handed to the loop from other threads end its wait
        self._calls: collections.deque = collections.deque()
        self._sessions: set[Session] = set()
        self._due: collections.deque[Session] = collections.deque()  # to flush at the end of this turn
        self._pool_keys: list = []
        self._pool_gen = -1
        self._accept_paused_until = 0.0
        self._stop = False
        self._thread: threading.Thread | None = None
        self._thread_id = 0

    # -- thread-safe API
    def start(self) -> None:
        self._listener.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, _ACCEPT)
        self._sel.register(self._waker, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name="data-plane", daemon=True)
        self._thread.start()

    def call_soon(self, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` on the loop's thread: now when called there, else at its next turn."""
        if threading.get_ident() == self._thread_id:
            fn(*args)
            return
        self._calls.append((fn, args))
        self._waker.wake()  # nothing when a wake-up is already pending, or the loop is gone

    def call(self, fn: Callable, timeout: float = 10.0):
        """Run ``fn()`` on the loop's thread and return its result (waits up to ``timeout``)."""
        if self._thread is None or not self._thread.is_alive() or threading.get_ident() == self._thread_id:
            return fn()
        done = threading.Event()
        box: list = []

        def run() -> None:
            try:
                box.append(fn())
            finally:
                done.set()

        self.call_soon(run)
        if not done.wait(timeout):
            raise TimeoutError(f"the data-plane loop did not answer within {timeout}s")
        return box[0] if box else None

    def sessions(self) -> list[Session]:
        return list(self._sessions)

    def stop(self, timeout: float = 5.0) -> None:
        """Close every session and the listener, then end the loop."""
        def close_all() -> None:
            for s in list(self._sessions):
                s.close()
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(self._listener)
            self._listener.close()
            self._stop = True

        try:
            self.call(close_all, timeout)
        except TimeoutError:
            log.warning("data plane did not stop within %.0fs", timeout)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- what sessions ask of their host (session_host.SessionHost)
    def submit(self, task: Task) -> None:
        self._builds.submit(task)

    def cancel(self, tasks: list[Task]) -> None:
        self._builds.cancel(tasks)

    def shutting_down(self) -> bool:
        return self._server.shutting_down

    def count_auth_failure(self) -> None:
        self._server.count_auth_failure()

    def prefetch(self, batch: BatchId) -> None:
        self._server.prefetch(batch)

    # (the loop's thread from here on)
    def closed(self, session: Session) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(session.sock)
        if session in self._sessions:
            self._sessions.discard(session)
            self.stats.stream_closed(session.authenticated)

    def want_write(self, session: Session, on: bool) -> None:
        with contextlib.suppress(KeyError, ValueError):  # not registered yet (handshake start) or already gone
            self._sel.modify(session.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if on else 0), session)

    def flush_later(self, session: Session) -> None:
        self._due.append(session)

    # -- the loop
    def _run(self) -> None:
        self._thread_id = threading.get_ident()
        next_tick = time.monotonic() + TICK_S
        while not self._stop:
            try:
                if self._pool.generation != self._pool_gen:
                    self._watch_pool()
                timeout = max(0.0, next_tick - time.monotonic()) if not (self._calls or self._due) else 0.0
                ready = self._sel.select(timeout)
                pool_ready = []
                for key, events in ready:
                    data = key.data
                    if isinstance(data, Session):
                        if events & selectors.EVENT_READ:
                            data.on_readable()
                        if events & selectors.EVENT_WRITE and not data.closed:
                            data.on_writable()
                    elif data == _ACCEPT:
                        self._accept()
                    elif data == _WAKE:
                        self._waker.drain()
                    else:
                        pool_ready.append(data[1])
                if pool_ready:
                    self._pool.handle_ready(pool_ready)
                while self._calls:
                    fn, args = self._calls.popleft()
                    fn(*args)
                while self._due:  # one popped at a time: a failing flush leaves the rest due
                    self._due.popleft().flush()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK_S
                    self._pool.tick()
                    for s in list(self._sessions):
                        s.check_deadlines(now)
                    if self._accept_paused_until and now >= self._accept_paused_until:
                        self._accept_paused_until = 0.0
                        self._sel.register(self._listener, selectors.EVENT_READ, _ACCEPT)
            except Exception:  # a bug here must not silently stop every consumer
                log.exception("data-plane loop error (continuing)")
                time.sleep(0.05)
        for key in list(self._sel.get_map().values()):
            self._sel.unregister(key.fileobj)
        self._sel.close()
        self._waker.close()

    def _watch_pool(self) -> None:
        for obj in self._pool_keys:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(obj)
        self._pool_gen = self._pool.generation
        self._pool_keys = []
        for obj in self._pool.wait_objects():
            try:
                self._sel.register(obj, selectors.EVENT_READ, (_POOL, obj))
            except (KeyError, ValueError, OSError):
                continue  # closed under us: the next generation drops it
            self._pool_keys.append(obj)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("data plane: accept failed (%s); pausing %.1fs", exc, ACCEPT_PAUSE_S)
                    self._sel.unregister(self._listener)
                    self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
                return  # ECONNABORTED and the like: the next wake-up retries
            try:
                framing.tune(sock)
                sock.setblocking(False)
                if self._tls is not None:
                    sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except OSError:
                sock.close()
                continue
            session = Session(self, sock, f"{peer[0]}:{peer[1]}")
            self._sessions.add(session)
            self.stats.stream_opened()
            self._sel.register(sock, selectors.EVENT_READ, session)
            session.start()
