"""Bytes a data-plane connection has read and not parsed yet: frame headers are cut from its front."""
from __future__ import annotations

import socket

from data_service.protocol import framing
from data_service.errors import ProtocolError
from data_service.protocol.generated import pb

RECV_CHUNK = 1 << 18  # frame headers (and small payloads) are read this many bytes at a time


class RecvBuffer:
    """A growable buffer of unparsed bytes, ``buf[start:end]``, for one connection to ``address``."""

    def __init__(self, address: str, size: int = RECV_CHUNK) -> None:
        self.address = address
        self.buf = bytearray(size)
        self.start = self.end = 0

    def take(self, dest: memoryview, need: int) -> int:
        """Move up to ``need`` buffered bytes into ``dest`` (a payload's first bytes that came in with
        its header); returns how many."""
        k = min(self.end - self.start, need)
        if k:
            with memoryview(self.buf) as b:
                dest[:k] = b[self.start:self.start + k]
            self.start += k
        return k

    def frame(self) -> pb.BulkFrame | None:
        """The next whole frame header, taken off the buffer; None when more bytes are needed
        (the buffer then has room for the rest of it)."""
        lsize = framing._LEN.size
        have = self.end - self.start
        if have >= lsize:
            (n,) = framing._LEN.unpack_from(self.buf, self.start)
            if n > framing.MAX_FRAME:
                raise ProtocolError(f"frame header of {n} bytes exceeds the {framing.MAX_FRAME}-byte limit: "
                                    "not a heterodata.v1 peer?")
            if have >= lsize + n:
                frame = pb.BulkFrame()
                begin = self.start + lsize
                try:
                    with memoryview(self.buf) as b:
                        frame.ParseFromString(b[begin:begin + n])
                except Exception as exc:  # protobuf raises DecodeError; anything else is garbage too
                    raise ProtocolError(f"unparsable frame header ({n} bytes): {exc}") from None
                self.start = begin + n
                return frame
            want = lsize + n
        else:
            want = lsize
        # More bytes needed: move the unparsed tail to the front (growing for a large header).
        if self.start:
            self.buf[:have] = self.buf[self.start:self.end]
            self.start, self.end = 0, have
        if want > len(self.buf):
            self.buf.extend(bytes(want - len(self.buf)))
        return None

    def fill(self, sock: socket.socket) -> tuple[int, int]:
        """Read what ``sock`` has into the free end; returns (bytes read, room there was). Raises
        the socket's would-block error when it has nothing, ``PeerClosed`` when the peer closed."""
        room = len(self.buf) - self.end
        k = sock.recv_into(memoryview(self.buf)[self.end:])
        if k == 0:
            if self.end > self.start:
                raise framing.PeerClosed(f"{self.address} closed the connection inside a frame")
            raise framing.PeerClosed(f"{self.address} closed the connection")
        self.end += k
        return k, room
