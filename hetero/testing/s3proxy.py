"""A loopback S3 fault proxy in front of moto's real server, for tests and benchmarks.

    with s3_server(latency_s=0.03) as srv:          # moto on a free port, the proxy in front
        os.environ.update(srv.env)                  # AWS_ENDPOINT_URL -> the proxy, dummy keys
        srv.proxy.fail_next("503", count=2, match="shard-000001")
        ...                                         # boto3 / S3Store calls go through the proxy
        srv.proxy.counters()                        # requests by method, ranged GETs, body bytes

The proxy speaks HTTP/1.1 with keep-alive to the client and keeps one upstream connection to moto
per client connection. It forwards every method, header and body unchanged (Host included, so
SigV4-signed requests arrive as signed), and on demand:

- delays each response by ``latency_s`` before its first byte (S3's first-byte latency), and
  limits each connection's response bodies to ``bandwidth_bps`` bytes per second;
- answers the next N matching requests with a fault instead (``fail_next``): ``"503"`` (S3's
  SlowDown XML), ``"500"`` (InternalError), ``"403"`` (AccessDenied), ``"reset"`` (close with a
  TCP reset, no response), ``"reset_body"`` (status, headers and half the body, then a reset),
  ``"stall"`` (status and headers, then silence), ``"stall_headers"`` (silence before any
  response byte), ``"truncate"`` (the full Content-Length announced, half the body sent, then a
  clean close). A stall lasts until the client closes the connection, ``stall_max_s`` passes or
  the proxy closes.

The HTTP side is s3proxy_handler.py; moto's server with this proxy in front is s3server.py.
A supported part of the test kit (docs/testing.md); the product never imports it.
"""
from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field

from .s3proxy_handler import _Handler, _Server

FAULTS = ("503", "500", "403", "reset", "reset_body", "stall", "stall_headers", "truncate")


@dataclass
class _Fault:
    kind: str
    count: int
    match: str | None
    method: str | None
    hits: int = 0


@dataclass
class _Counters:
    requests: Counter = field(default_factory=Counter)       # method -> requests
    ranged_gets: int = 0
    body_bytes: Counter = field(default_factory=Counter)     # method -> response body bytes sent
    path_bytes: Counter = field(default_factory=Counter)     # path (no query) -> response body bytes sent
    faults: Counter = field(default_factory=Counter)         # kind -> faults injected
    fault_bytes: int = 0                                     # bytes of injected error bodies (not above)
    connections: int = 0


class S3FaultProxy:
    """An HTTP proxy on 127.0.0.1 forwarding to ``target`` (moto's host, port), injecting latency,
    a bandwidth limit and faults. ``endpoint`` is the URL clients use as AWS_ENDPOINT_URL."""

    def __init__(self, target: tuple[str, int], *, latency_s: float = 0.0, bandwidth_bps: float | None = None,
                 stall_max_s: float | None = None, port: int = 0) -> None:
        self.target = target
        self.latency_s = latency_s
        self.bandwidth_bps = bandwidth_bps
        self.stall_max_s = stall_max_s
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._c = _Counters()
        self._closed = threading.Event()
        self._sockets: set[socket.socket] = set()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = _Server(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"s3proxy-{self.port}", daemon=True)
        self._thread.start()

    # -- faults ----------------------------------------------------------------------------
    def fail_next(self, kind: str, count: int = 1, match: str | None = None, method: str | None = None) -> None:
        """Answer the next ``count`` requests whose path contains ``match`` (any, if None) and whose
        method is ``method`` (any, if None) with the fault ``kind`` (one of FAULTS). Faults queued
        earlier are matched first."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; expected one of {', '.join(FAULTS)}")
        with self._lock:
            self._faults.append(_Fault(kind, count, match, method.upper() if method else None))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def pending_faults(self) -> int:
        with self._lock:
            return sum(f.count for f in self._faults)

    def _take_fault(self, method: str, path: str) -> str | None:
        with self._lock:
            for f in self._faults:
                if (f.method is None or f.method == method) and (f.match is None or f.match in path):
                    f.count -= 1
                    if f.count <= 0:
                        self._faults.remove(f)
                    self._c.faults[f.kind] += 1
                    return f.kind
        return None

    # -- counters ----------------------------------------------------------------------------
    def counters(self) -> dict:
        """A snapshot: ``requests`` by method, ``ranged_gets``, response ``body_bytes`` by method
        (``body_bytes["GET"]`` = what clients read; counted just before each write), ``path_bytes``
        by path, ``faults`` by kind, ``fault_bytes`` (the bodies of injected errors, counted in
        neither of the above), ``connections`` accepted."""
        with self._lock:
            c = self._c
            return {"requests": dict(c.requests), "ranged_gets": c.ranged_gets, "body_bytes": dict(c.body_bytes),
                    "path_bytes": dict(c.path_bytes), "faults": dict(c.faults), "fault_bytes": c.fault_bytes,
                    "connections": c.connections}

    @property
    def requests(self) -> int:
        with self._lock:
            return sum(self._c.requests.values())

    @property
    def get_bytes(self) -> int:
        with self._lock:
            return self._c.body_bytes["GET"]

    def reset_counters(self) -> None:
        with self._lock:
            self._c = _Counters()

    def _count(self, **kw) -> None:
        with self._lock:
            for k, v in kw.items():
                if k == "method":
                    self._c.requests[v] += 1
                elif k == "ranged":
                    self._c.ranged_gets += v
                elif k == "connection":
                    self._c.connections += v

    def _count_body(self, method: str, path: str, n: int) -> None:
        with self._lock:
            self._c.body_bytes[method] += n
            self._c.path_bytes[path] += n

    # -- life ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting, end stalls and close every client connection."""
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            socks = list(self._sockets)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def __enter__(self) -> S3FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["FAULTS", "S3FaultProxy"]
