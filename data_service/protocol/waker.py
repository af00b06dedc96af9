"""Wake a selector loop from another thread.

Both ends run their sockets on one thread blocked in ``select``: the server's data plane
(``server/dataplane.py``: calls handed to its loop) and the consumer's loop (``ServerSet.wait``:
a connection attempt that finished on its own thread). Work finished elsewhere must end that wait
at once, not at the loop's next turn: a ``Waker`` is a socket pair whose reading end the selector
watches, and ``wake()`` writes a byte to the other end. Closing is guarded, so a thread that wakes
a loop already closed does nothing (it can never write into a descriptor number reused meanwhile).
"""
from __future__ import annotations

import contextlib
import socket
import threading


class Waker:
    """A socket pair: register the object with a selector, ``wake()`` from any thread, ``drain()``
    on the selector's thread once it reports the waker readable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self._pending = False  # a byte is on its way: more wakes before the drain add nothing

    def fileno(self) -> int:
        return self._read.fileno()

    def wake(self) -> None:
        """End the selector's wait (now, or its next one); a no-op once closed."""
        with self._lock:
            if self._pending or self._write.fileno() < 0:
                return
            self._pending = True
            with contextlib.suppress(OSError):  # full: bytes already wait to be read, which wakes it as well
                self._write.send(b"\0")

    def drain(self) -> None:
        """Read what ``wake`` wrote, so the next wait blocks again."""
        with self._lock:
            self._pending = False
            with contextlib.suppress(OSError):  # BlockingIOError: nothing more to read
                while self._read.recv(4096):
                    pass

    def close(self) -> None:
        with self._lock:
            self._read.close()
            self._write.close()
