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

Used by tests/test_s3store.py and the S3 read benchmark; the product never imports it.
"""
from __future__ import annotations

import contextlib
import http.client
import os
import select
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("503", "500", "403", "reset", "reset_body", "stall", "stall_headers", "truncate")

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
               "te", "trailer", "transfer-encoding", "upgrade", "expect"}

_ERRORS = {
    "503": (503, "Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError",
            "We encountered an internal error. Please try again."),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied"),
}

_CHUNK = 1 << 20


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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:  # a client that went away is no news
        pass


class _Reset(Exception):
    """Abort the connection with a TCP reset."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: S3FaultProxy

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._upstream: http.client.HTTPConnection | None = None
        self.owner._count(connection=1)
        with self.owner._lock:
            self.owner._sockets.add(self.connection)

    def finish(self) -> None:
        with self.owner._lock:
            self.owner._sockets.discard(self.connection)
        if self._upstream is not None:
            self._upstream.close()
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format, *args) -> None:
        pass

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except _Reset:
            self._abort()
        except (OSError, http.client.HTTPException):
            self.close_connection = True

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # every method: GET, HEAD, PUT, POST, DELETE, ...
            return self._proxy
        raise AttributeError(name)

    # -- one request -------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _proxy(self) -> None:
        owner = self.owner
        method = self.command
        path = self.path.split("?", 1)[0]
        body = self._read_body()
        owner._count(method=method, ranged=int(method == "GET" and "Range" in self.headers))
        fault = owner._take_fault(method, self.path)
        if fault == "reset":
            raise _Reset
        if fault == "stall_headers":
            self._stall()
            return
        if fault in _ERRORS:
            self._error(fault, path)
            return
        resp = self._forward(method, body)
        length = resp.getheader("Content-Length")
        no_body = method == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        data = None
        if not no_body and length is None:  # chunked or read-to-close upstream: buffer it, send a length
            data = resp.read()
            length = str(len(data))
        if owner.latency_s:
            time.sleep(owner.latency_s)
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP_BY_HOP and not (data is not None and k.lower() == "content-length"):
                self.send_header(k, v)
        if data is not None:
            self.send_header("Content-Length", length)
        if resp.will_close:  # moto closes after this response: the next request reconnects upstream
            self._upstream_closing = True
        self.end_headers()
        if no_body:
            resp.read()
            return
        total = int(length)
        if fault == "stall":
            self.wfile.flush()
            self._stall()
            return
        limit = total // 2 if fault in ("truncate", "reset_body") else total
        self._send_body(resp, data, limit, method, path)
        if limit < total:
            if fault == "reset_body":
                raise _Reset
            self.close_connection = True
            self._upstream.close()
            self._upstream = None
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_WR)
        elif data is None:
            resp.read()  # drain the upstream response (nothing left) so the connection is reusable
        if getattr(self, "_upstream_closing", False) and self._upstream is not None:
            self._upstream.close()
            self._upstream = None
            self._upstream_closing = False

    def _forward(self, method: str, body: bytes) -> http.client.HTTPResponse:
        for attempt in range(2):  # moto may have closed an idle keep-alive connection: reconnect once
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(*self.owner.target, timeout=300)
            conn = self._upstream
            try:
                conn.putrequest(method, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
                        conn.putheader(k, v)
                if body or method in ("PUT", "POST"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                return conn.getresponse()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _send_body(self, resp, data: bytes | None, limit: int, method: str, path: str) -> None:
        owner = self.owner
        bps = owner.bandwidth_bps
        chunk = min(_CHUNK, max(4096, int(bps / 20))) if bps else _CHUNK
        sent = 0
        start = time.monotonic()
        while sent < limit:
            n = min(chunk, limit - sent)
            piece = data[sent:sent + n] if data is not None else resp.read(n)
            if not piece:
                break
            owner._count_body(method, path, len(piece))  # before the write: the client never sees uncounted bytes
            self.wfile.write(piece)
            sent += len(piece)
            if bps:
                ahead = sent / bps - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)

    def _error(self, kind: str, path: str) -> None:
        status, reason, code, message = _ERRORS[kind]
        key = path.lstrip("/")
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                f"<Resource>/{key}</Resource><RequestId>S3PROXY{kind}</RequestId></Error>").encode()
        if self.owner.latency_s:
            time.sleep(self.owner.latency_s)
        self.send_response_only(status, reason)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", f"S3PROXY{kind}")
        no_body = self.command == "HEAD"
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not no_body:
            with self.owner._lock:
                self.owner._c.fault_bytes += len(body)
            self.wfile.write(body)

    def _stall(self) -> None:
        """Send nothing more until the client closes, ``stall_max_s`` passes or the proxy closes."""
        owner = self.owner
        deadline = time.monotonic() + owner.stall_max_s if owner.stall_max_s is not None else None
        sock = self.connection
        while not owner._closed.is_set() and (deadline is None or time.monotonic() < deadline):
            try:
                readable, _, _ = select.select([sock], [], [], 0.05)
                if readable and not sock.recv(65536):
                    break  # the client gave up
            except (OSError, ValueError):
                break
        self.close_connection = True

    def _abort(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()


# ----------------------------------------------------------------------------------------------
@dataclass
class S3Server:
    """What ``s3_server`` yields: moto's server, the proxy in front and the environment a client
    needs (``env``: AWS_ENDPOINT_URL -> the proxy, dummy credentials, us-east-1, no IMDS)."""
    moto: object
    proxy: S3FaultProxy
    moto_endpoint: str

    @property
    def endpoint(self) -> str:
        return self.proxy.endpoint

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    @contextlib.contextmanager
    def environ(self) -> Iterator[None]:
        """Set ``env`` in os.environ (AWS_ENDPOINT_URL_S3 and AWS_PROFILE cleared) for the block."""
        keys = list(self.env) + ["AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"]
        saved = {k: os.environ.get(k) for k in keys}
        for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            os.environ.pop(k, None)
        os.environ.update(self.env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def client(self, direct: bool = False):
        """A boto3 S3 client on the proxy (or straight on moto with ``direct``), path-style."""
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.moto_endpoint if direct else self.endpoint,
                            region_name="us-east-1", aws_access_key_id="testing",
                            aws_secret_access_key="testing", config=Config(s3={"addressing_style": "path"}))

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API, called straight on moto)."""
        host, port = self.moto_endpoint.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("POST", "/moto-api/reset")
            conn.getresponse().read()
        finally:
            conn.close()


@contextlib.contextmanager
def s3_server(latency_s: float = 0.0, bandwidth_bps: float | None = None,
              stall_max_s: float | None = None) -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port with an ``S3FaultProxy`` in front; both stop on exit.

    moto keeps its buckets in this process's memory (shared with any other moto server or mock
    here), so tests use their own bucket names or call ``reset()``.
    """
    import logging

    from moto.server import ThreadedMotoServer

    wlog = logging.getLogger("werkzeug")  # moto's server logs every request at INFO
    level = wlog.level
    wlog.setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    proxy = S3FaultProxy((host, port), latency_s=latency_s, bandwidth_bps=bandwidth_bps, stall_max_s=stall_max_s)
    try:
        yield S3Server(moto=moto, proxy=proxy, moto_endpoint=f"http://{host}:{port}")
    finally:
        proxy.close()
        moto.stop()
        wlog.setLevel(level)


def serve_forever_main() -> None:  # pragma: no cover - a manual helper: python -m hetero.testing.s3proxy
    import argparse
    ap = argparse.ArgumentParser(description="moto S3 behind a latency/fault proxy, until Ctrl-C")
    ap.add_argument("--latency-s", type=float, default=0.0)
    ap.add_argument("--bandwidth-bps", type=float, default=None)
    args = ap.parse_args()
    with s3_server(latency_s=args.latency_s, bandwidth_bps=args.bandwidth_bps) as srv:
        print("\n".join(f"export {k}={v}" for k, v in srv.env.items()), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":  # pragma: no cover
    serve_forever_main()


__all__ = ["FAULTS", "S3FaultProxy", "S3Server", "s3_server"]
