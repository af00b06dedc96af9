"""One data-plane connection's outgoing frames on the server: queued, then written without copies.

A frame is a header, then (TCP batches) the bytes of the worker's slot it was built into. Frames
are written at the end of the loop's turn that queued them, and every frame waiting then leaves
in one ``sendmsg`` (an SSL socket has none: one buffer per ``send``); partial writes resume where
they stopped. A batch's slot is released once its last byte is written, never before, and its
figures go to the server's stats then. The queue notes when the socket last took bytes, so its
session can drop a consumer that takes none (session.py).
"""
from __future__ import annotations

import collections
import ssl
import time
from typing import TYPE_CHECKING, Callable, cast

from ..pool.tasks import Result

if TYPE_CHECKING:
    from .stats import ServerStats

COALESCE_BUFFERS = 64  # buffers (two per TCP batch) handed to one sendmsg when several frames wait


class _Out:
    """One frame waiting to be written: header bytes, then (TCP batches) the slot's bytes."""

    __slots__ = ("head", "payload", "result", "figures", "done", "size", "started")

    def __init__(self, head: bytes, payload: memoryview | None = None, result: Result | None = None,
                 figures: tuple[int, int, float] | None = None) -> None:
        self.head = head
        self.payload = payload
        self.result = result        # released once written (TCP batches)
        self.figures = figures      # batches: (raw_bytes, payload_bytes, compress_s), counted once written
        self.done = 0
        self.size = len(head) + (len(payload) if payload is not None else 0)
        self.started = time.perf_counter()

    def unsent(self) -> list:
        """The buffers still to write."""
        hl = len(self.head)
        if self.done >= hl:
            return [cast(memoryview, self.payload)[self.done - hl:]]  # unsent past the head: the payload
        head = memoryview(self.head)[self.done:] if self.done else self.head
        return [head] if self.payload is None else [head, self.payload]


class SendQueue:
    """The frames waiting for one connection's non-blocking socket; see the module docstring.

    Args:
        sock: the connection's socket (an ``ssl.SSLSocket`` when TLS is on).
        stats: counts each batch once its last byte is written.
        flush_later: asks the loop to call the session's ``flush()`` at the end of its turn.
        want_write: (un)registers the socket for writability with the loop.
    """

    def __init__(self, sock, stats: "ServerStats", flush_later: Callable[[], None],
                 want_write: Callable[[bool], None]) -> None:
        self._sock = sock
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._stats = stats
        self._flush_later = flush_later
        self._register = want_write
        self._out: collections.deque[_Out] = collections.deque()
        self.writing = False       # registered for writability
        self.flush_due = False     # the loop will flush at the end of its turn
        self.closed = False
        self.progress_at = time.monotonic()  # when the socket last took bytes, or the queue last filled

    def __len__(self) -> int:
        return len(self._out)

    def put(self, head: bytes, payload: memoryview | None = None, result: Result | None = None,
            figures: tuple[int, int, float] | None = None) -> None:
        """Queue a frame; ``result`` (TCP batches) is released once ``payload`` is written."""
        if not self._out:
            self.progress_at = time.monotonic()
        self._out.append(_Out(head, payload if payload is not None and len(payload) else None, result, figures))
        if not self.writing and not self.flush_due:
            # Written at the end of the loop's turn, with whatever else this turn queued: the
            # batches of one worker message reach the consumer in one sendmsg and one wake-up.
            self.flush_due = True
            self._flush_later()

    def write(self) -> bool:
        """Write what the socket takes; False when the socket failed (the connection is over)."""
        sock, out = self._sock, self._out
        try:
            while out and not self.closed:
                if self._tls:
                    n = sock.send(out[0].unsent()[0])  # an SSL socket has no sendmsg
                else:
                    # Every frame that waits, in one call: header and slot bytes, no copy.
                    bufs = []
                    for item in out:
                        bufs += item.unsent()
                        if len(bufs) >= COALESCE_BUFFERS:
                            break
                    n = sock.sendmsg(bufs)
                if n > 0:
                    self.progress_at = time.monotonic()
                while out:
                    item = out[0]
                    left = item.size - item.done
                    if n < left:
                        item.done += n
                        break
                    n -= left
                    out.popleft()
                    self._sent(item)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            self.want_write(True)
            return True
        except OSError:
            return False
        self.want_write(False)
        return True

    def _sent(self, item: _Out) -> None:
        if item.figures is not None:
            raw, payload, compress_s = item.figures
            self._stats.record_sent(item.size, raw, time.perf_counter() - item.started, payload, compress_s)
        if item.result is not None:
            item.payload = None
            item.result.release()

    def want_write(self, on: bool) -> None:
        """(Un)register the socket for writability: frames wait, or the TLS handshake wants to write."""
        if on != self.writing and not self.closed:
            self.writing = on
            self._register(on)

    def close(self) -> list[Result]:
        """Drop every waiting frame; returns the results of the batches among them, to be released."""
        self.closed = True
        unsent = [o.result for o in self._out if o.result is not None]
        self._out.clear()
        return unsent
