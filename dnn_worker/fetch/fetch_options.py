"""How a consumer talks to its data servers: the options of one ``Fetcher``, checked once.

``FetchOptions`` holds what every connection and the scheduler share (the job token, the
request window, the deadlines, TLS, shared memory); ``RemoteDataset`` builds one from its own
arguments, once, and each epoch's ``Fetcher`` takes a copy naming its process and the servers'
pipeline. ``connect`` opens one server: the control-plane Hello, then the data-plane
connection; ``Attempt`` runs it on a short-lived thread, so a server that accepts but never
answers delays nobody else's batches.
"""
from __future__ import annotations

import functools
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Callable

from data_service.protocol.addresses import split_address
from data_service.errors import ConfigError
from data_service.protocol.window import default_window
from data_service.protocol.generated import pb

from ..transport.connection import BulkConnection
from ..transport.control import ControlClient

HELLO_TIMEOUT_S = 2.0  # the control-plane Hello of one connection attempt
OPEN_TIMEOUT_S = 5.0   # the data-plane handshake of one connection attempt


@dataclass(frozen=True)
class FetchOptions:
    """Options of one ``Fetcher`` (see ``RemoteDataset`` for each one's meaning to a user).

    Args:
        token: the job token (not empty).
        window: outstanding requests per server (None: 2 x that server's worker processes, at
            least 4, each server's own).
        small_window: outstanding requests per server while batches are at most
            ``scheduler.SMALL_BATCH_BYTES`` (0: always the window).
        connect_timeout: the longest the iteration goes on while no server is usable (none
            connected, or every one draining and owing nothing); then it raises
            ``ServerUnavailableError`` naming each server's last error. It does not bound a
            server that connects and then fails every batch: ``batch_attempts`` does.
        batch_timeout: the longest a server may owe batches without delivering one; it is then
            dropped (its batches go to the others, or to it again once reconnected) and each batch
            it owed counts one failed attempt.
        batch_attempts: failed attempts in a row after which one batch ends the iteration with
            ``BatchFailedError`` (its bytes failed their checksum, a server answered it with an
            error, or the connection ended before it came; hedged copies count; a reconnect resets
            nothing; see ``attempts.py``).
        fingerprint: pipeline fingerprint every server must report ("" = take the first's).
        shared_memory: read batches from shared memory when a server runs on this host.
        tls_ca, tls_server_name: verify TLS servers against this CA bundle (data_service.protocol.tls).

    Raises:
        ConfigError: a value out of range, naming it; a CA bundle that cannot be read.
    """

    token: str
    window: int | None = None
    small_window: int = 0
    connect_timeout: float = 60.0
    batch_timeout: float = 300.0
    batch_attempts: int = 3
    client_id: str = ""
    fingerprint: str = ""
    pin_memory: bool = False
    max_batch_bytes: int = 1 << 40
    shared_memory: bool = True
    tls_ca: str = ""
    tls_server_name: str = ""

    def __post_init__(self) -> None:
        if not self.token:
            raise ConfigError("token='' : pass the job token the data servers were started with")
        if self.window is not None and self.window < 1:
            raise ConfigError(f"window={self.window} must be >= 1")
        if self.batch_attempts < 1:
            raise ConfigError(f"batch_attempts={self.batch_attempts} must be >= 1 (failed attempts at one batch "
                              "that end the iteration; 3 by default)")
        for name in ("connect_timeout", "batch_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be > 0 seconds")
        if self.small_window < 0:
            raise ConfigError(f"small_window={self.small_window} must be >= 0 (0: always the window)")
        if self.tls_ca:
            self.tls_context  # read the CA bundle now, not at the first connection

    @functools.cached_property
    def tls_context(self) -> ssl.SSLContext | None:
        """The client's TLS context from ``tls_ca`` (None without one)."""
        from data_service.protocol.tls import client_context

        return client_context(self.tls_ca) if self.tls_ca else None

    def __getstate__(self) -> dict[str, Any]:
        # An SSLContext does not pickle: a copy (a DataLoader worker's) makes its own from tls_ca.
        state = dict(self.__dict__)
        state.pop("tls_context", None)
        return state

    def window_for(self, hello: pb.HelloResponse | None) -> int:
        """The window of one server: the one given, else 2 x its worker processes, at least 4."""
        if self.window is not None:
            return self.window
        return default_window(hello.workers if hello is not None else 0)


def connect(address: str, options: FetchOptions) -> tuple[pb.HelloResponse, BulkConnection]:
    """The control-plane Hello, then the data-plane connection of one server."""
    host, _ = split_address(address)
    with ControlClient(address, options.token, options.client_id, options.tls_ca, options.tls_server_name) as ctl:
        hello = ctl.hello(timeout=HELLO_TIMEOUT_S)
    if hello.shutting_down:
        raise ConnectionError("server is shutting down")
    if hello.bulk_tls and options.tls_context is None:
        raise ConfigError(f"server {address} serves TLS; pass tls_ca= (the CA bundle that signed its certificate)")
    # Never allocate more than the server said its batches can be, whatever a header claims.
    limit = min(options.max_batch_bytes, hello.dataset.max_batch_bytes or options.max_batch_bytes)
    conn = BulkConnection(address, host, hello.bulk_port, options.token, options.client_id, limit,
                          options.pin_memory, options.shared_memory and not hello.bulk_tls,
                          options.tls_context if hello.bulk_tls else None, options.tls_server_name)
    conn.open(timeout=OPEN_TIMEOUT_S)
    return hello, conn


class Attempt:
    """One connection attempt on a thread of its own; the iterating thread takes its result."""

    def __init__(self, address: str, options: FetchOptions, on_done: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._on_done = on_done  # called on the attempt's thread once its result is set
        self.done = False
        self._abandoned = False  # the caller closed meanwhile: the attempt's thread closes what it opened
        self.hello: pb.HelloResponse | None = None
        self.conn: BulkConnection | None = None
        self.exc: BaseException | None = None
        threading.Thread(target=self._run, args=(address, options), name=f"connect {address}", daemon=True).start()

    def _run(self, address: str, options: FetchOptions) -> None:
        hello = conn = exc = None
        try:
            hello, conn = connect(address, options)
        except BaseException as e:  # handed to the iterating thread, which raises or retries
            exc = e
        with self._lock:
            self.hello, self.conn, self.exc, self.done = hello, conn, exc, True
            abandoned = self._abandoned
        if abandoned:
            if conn is not None:
                conn.close()
        elif self._on_done is not None:
            self._on_done()

    def abandon(self) -> None:
        """Close what the attempt opened (now, or when it finishes)."""
        with self._lock:
            self._abandoned = True
            opened = self.conn if self.done else None
        if opened is not None:
            opened.close()
