"""A loopback TCP proxy for fault tests: adds delay, or cuts connections mid-stream."""
from __future__ import annotations

import socket
import threading
import time


class Proxy:
    """Forwards 127.0.0.1:<port> to ``target``.

    Args:
        delay_s: sleep before forwarding each chunk server -> client (a slow link).
        cut_after_bytes: close both sides once this many bytes went server -> client (a drop).
    """

    def __init__(self, target: tuple[str, int], delay_s: float = 0.0, cut_after_bytes: int | None = None) -> None:
        self.target = target
        self.delay_s = delay_s
        self.cut_after_bytes = cut_after_bytes
        self._lst = socket.socket()
        self._lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lst.bind(("127.0.0.1", 0))
        self._lst.listen(16)
        self.port = self._lst.getsockname()[1]
        self.connections = 0
        self.cuts = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._lst.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.connections += 1
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        sent = 0
        try:
            while True:
                data = src.recv(256 * 1024)
                if not data:
                    break
                if downstream and self.delay_s:
                    time.sleep(self.delay_s)
                if downstream and self.cut_after_bytes is not None and sent + len(data) > self.cut_after_bytes:
                    self.cuts += 1
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self._lst.close()
