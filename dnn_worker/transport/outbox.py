"""Frames a data-plane connection has to write on its non-blocking socket, and when they go.

The socket takes what it has room for; the rest waits here, in order, for the next send (the
connection's ``flush()``). A zero-copy batch's ``Release`` may be asked for on whatever thread
dropped the batch's last tensor, possibly inside a send on this very thread: such a release
never waits for the send lock (it is not re-entrant) and, when a send is under way, waits in a
deque (``append`` is safe in finalizers) to go out at the head of the next send.
"""
from __future__ import annotations

import collections
import socket
import ssl
import threading
from typing import cast

from data_service.protocol.framing import seal
from data_service.protocol.generated import pb

WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class Outbox:
    """What one connection has yet to write; ``sock`` is set once the connection is open."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self._out = bytearray()            # frames not yet written (the socket was full)
        self._lock = threading.Lock()
        self._releases: collections.deque = collections.deque()  # Release messages waiting for a send

    @property
    def pending(self) -> bool:
        """Frames or releases wait for the socket to take them."""
        return bool(self._out) or bool(self._releases)

    def send(self, data: bytes, wait: bool) -> bool:
        """Append ``data`` and write what the socket takes now; with ``wait=False`` only if no
        other send is under way (returns whether it got the lock). Raises OSError when the
        connection is gone."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            while self._releases:
                self._out += seal(pb.BulkFrame(release=self._releases.popleft()))
            self._out += data
            sock = cast(socket.socket, self.sock)  # set by BulkConnection.open, which comes before any send
            while self._out:
                try:
                    n = sock.send(self._out)
                except WOULD_BLOCK:
                    break
                del self._out[:n]
        finally:
            self._lock.release()
        return True

    def release(self, release: pb.Release, wait: bool) -> None:
        """Send ``release``; with ``wait=False`` (a finalizer) it waits for the next send when one
        is under way."""
        if not self.send(seal(pb.BulkFrame(release=release)), wait):
            self._releases.append(release)

    def drop_releases(self) -> None:
        """Forget the releases not sent yet (the connection ended: the server retires those slots)."""
        self._releases.clear()
