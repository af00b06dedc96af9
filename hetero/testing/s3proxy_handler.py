"""The S3 fault proxy's HTTP side: one client connection, forwarded to moto, faults injected.

``S3FaultProxy`` (s3proxy.py) serves each client connection with a subclass of ``_Handler`` bound
to itself (``owner``): the handler asks the proxy for the next fault, counts what it sends, and
otherwise forwards the request and streams the response at the proxy's latency and bandwidth.
"""
from __future__ import annotations

import contextlib
import http.client
import select
import socket
import struct
import time
from typing import Any, cast
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
               "te", "trailer", "transfer-encoding", "upgrade", "expect"}

_ERRORS = {
    "503": (503, "Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError",
            "We encountered an internal error. Please try again."),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied"),
}

_CHUNK = 1 << 20


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
    owner: Any  # the S3FaultProxy (s3proxy.py) this handler serves: faults, counters, limits

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
            parts: list[bytes] = []
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
            self.send_header("Content-Length", str(len(data)))
        if resp.will_close:  # moto closes after this response: the next request reconnects upstream
            self._upstream_closing = True
        self.end_headers()
        if no_body:
            resp.read()
            return
        total = int(cast(str, length))  # a body without a length upstream was buffered and given one above
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
            cast(http.client.HTTPConnection, self._upstream).close()  # _forward left the one it answered on
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
                host, port = self.owner.target
                self._upstream = http.client.HTTPConnection(host, port, timeout=300)
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
