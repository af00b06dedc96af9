"""A loopback TCP proxy that injects network faults: delay, cut after N bytes, cut now, stall.

Put it in front of a data server's data plane (``ServerProc(advertise_bulk_port=proxy.port)``)
and consumers dial the proxy; ``cut()`` then severs their connections mid-stream.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time


class FaultProxy:
    """Forwards 127.0.0.1:<port> to ``target`` and injects network faults on demand.

    Args:
        delay_s: sleep before forwarding each server -> client chunk (a slow link).
        cut_after_bytes: close a connection once this many bytes went server -> client.

    ``cut()`` severs every live connection now (a drop mid-stream); ``stall(True)`` stops
    forwarding without closing anything (a half-open link: packets vanish, no RST).
    """

    def __init__(self, target: tuple[str, int], delay_s: float = 0.0, cut_after_bytes: int | None = None,
                 port: int = 0) -> None:
        self.target = target
        self.delay_s = delay_s
        self.cut_after_bytes = cut_after_bytes
        self._lst = socket.socket()
        self._lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lst.bind(("127.0.0.1", port))
        self._lst.listen(64)
        self.port = self._lst.getsockname()[1]
        self.connections = 0
        self.cuts = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stalled = threading.Event()
        self._closed = False
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._lst.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self.connections += 1
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(256 * 1024)
                if not data:
                    break
                while self._stalled.is_set() and not self._closed:
                    time.sleep(0.05)  # hold the bytes: the peer sees silence, not a close
                if downstream and self.delay_s:
                    time.sleep(self.delay_s)
                if downstream and self.cut_after_bytes is not None and sent + len(data) > self.cut_after_bytes:
                    with self._lock:
                        self.cuts += 1
                    break
                dst.sendall(data)
                sent += len(data)
        self._close_pair(src, dst)

    def _close_pair(self, a: socket.socket, b: socket.socket) -> None:
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        with self._lock:
            self._pairs = [p for p in self._pairs if a not in p]

    def cut(self) -> int:
        """Sever every live connection (both sides see a reset/EOF). Returns how many."""
        with self._lock:
            pairs = list(self._pairs)
            self.cuts += len(pairs)
        for a, b in pairs:
            self._close_pair(a, b)
        return len(pairs)

    def stall(self, on: bool = True) -> None:
        (self._stalled.set if on else self._stalled.clear)()

    @property
    def live(self) -> int:
        with self._lock:
            return len(self._pairs)

    def close(self) -> None:
        self._closed = True
        self._stalled.clear()
        self._lst.close()
        self.cut()
