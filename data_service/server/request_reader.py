"""A consumer's frames as its data-plane session reads them: whole, checked, never misread.

A consumer whose hello says ``sealed`` ends every frame, its hello included, with a CRC-32 of
the frame (``framing.seal``). Its frames are checked before they are parsed, so a byte damaged
on the way fails the check instead of reading as another valid request (a request for batch 5
that became one for batch 7, a fetch that became a prefetch hint). A damaged length is caught
as well: a shorter one cuts the frame and its seal fails; a longer one announces bytes that
never come, and a consumer writes each (small) frame whole, at once, so a frame still
incomplete after ``REQUEST_WHOLE_S`` is damaged (or its link stalls). Either way the session
answers at once (session.py), instead of the consumer waiting out its ``batch_timeout``.

Hellos without the flag (consumers from before sealing) are read as before, unchecked.
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

from ..errors import ProtocolError
from ..protocol import framing
from ..protocol.generated import pb

REQUEST_WHOLE_S = 1.0  # a frame begun must be whole this soon (consumers write each frame at once)


class RequestReader:
    """Bytes a session received and has not parsed yet, and what it knows of its consumer's frames."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.sealed = False  # the consumer seals its frames (its hello said so)
        self._partial_since: float | None = None  # when the incomplete frame in ``buf`` began arriving

    def frames(self, authenticated: Callable[[], bool]) -> Iterator[pb.BulkFrame]:
        """The whole frames in ``buf``, each taken out as it is yielded (stop iterating to leave the
        rest). ``authenticated``: whether the hello was accepted (asked before each frame).

        Raises:
            ProtocolError: a frame longer than ``framing.MAX_FRAME``, unparsable, or (sealed)
            failing its CRC-32.
        """
        buf, pos, size = self.buf, 0, framing._LEN.size
        try:
            while len(buf) - pos >= size:
                (n,) = framing._LEN.unpack_from(buf, pos)
                if n > framing.MAX_FRAME:
                    raise ProtocolError(f"frame header of {n} bytes exceeds the {framing.MAX_FRAME}-byte limit: "
                                        "not a heterodata.v1 peer, or its length was damaged on the way")
                if len(buf) - pos - size < n:
                    break
                body = buf[pos + size:pos + size + n]
                pos += size + n
                yield self._parse(body, authenticated())
        finally:
            del buf[:pos]
            if not buf:
                self._partial_since = None
            elif pos or self._partial_since is None:
                self._partial_since = time.monotonic()

    def _parse(self, body: bytearray, authenticated: bool) -> pb.BulkFrame:
        inner = framing.unseal(body) if self.sealed or not authenticated else None
        if self.sealed and inner is None:
            raise ProtocolError(f"a {len(body)}-byte frame fails its CRC-32: damaged on the way; ask again")
        frame = pb.BulkFrame()
        try:
            frame.ParseFromString(inner if inner is not None else bytes(body))
        except Exception as exc:  # protobuf raises DecodeError; anything else is garbage too
            raise ProtocolError(f"unparsable frame header ({len(body)} bytes): {exc}") from None
        if not authenticated and frame.WhichOneof("kind") == "hello" and frame.hello.sealed:
            self.sealed = True
            if inner is None:  # its flag says sealed and its seal does not match: damaged
                raise ProtocolError(f"a {len(body)}-byte hello from {frame.hello.client_id or '?'} fails its CRC-32: "
                                    "damaged on the way; connect again")
        return frame

    def stalled(self, now: float) -> str | None:
        """Why the connection should end now: a frame begun ``REQUEST_WHOLE_S`` ago still incomplete."""
        since = self._partial_since
        if since is None or now - since <= REQUEST_WHOLE_S:
            return None
        size = framing._LEN.size
        announced = framing._LEN.unpack_from(self.buf)[0] if len(self.buf) >= size else 0
        return (f"a frame stayed incomplete for {now - since:.1f}s ({max(0, len(self.buf) - size)} of the {announced} "
                "bytes its length announces): damaged on the way, or the link stalls; ask again")
