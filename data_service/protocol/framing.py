"""Length-prefixed frames on the data-plane socket (see proto/ for the layout)."""
from __future__ import annotations

import hmac
import os
import hashlib
import socket
import struct
import zlib

from ..errors import ProtocolError
from .generated import pb

MAX_FRAME = 1 << 20  # a BulkFrame header is small; anything larger is garbage or hostile
_LEN = struct.Struct("<I")


class PeerClosed(ConnectionError):
    """The peer closed the connection (EOF)."""


_BATCH_KEY = bytes([(pb.BulkFrame.DESCRIPTOR.fields_by_name["batch"].number << 3) | 2])  # length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def batch_frame(header: bytes, extra: bytes = b"") -> bytes:
    """The length-prefixed ``BulkFrame(batch=...)`` of an already serialized ``BatchHeader``.

    ``extra`` (more serialized ``BatchHeader`` fields) is appended: protobuf merges concatenated
    messages, so the consumer reads one header. Equal to serializing the frame, without parsing
    the header first.
    """
    body = len(header) + len(extra)
    key = _BATCH_KEY + _varint(body)
    return b"".join((_LEN.pack(len(key) + body), key, header, extra))


def frame_bytes(frame: pb.BulkFrame) -> bytes:
    """``frame`` as it goes on the wire: its length, then its bytes."""
    head = frame.SerializeToString()
    return _LEN.pack(len(head)) + head


_SEAL_TAG = bytes([(pb.BulkFrame.DESCRIPTOR.fields_by_name["crc32"].number << 3) | 5])  # fixed32
SEAL_BYTES = len(_SEAL_TAG) + 4


def seal(frame: pb.BulkFrame) -> bytes:
    """``frame`` as a sealed client sends it: its length, its bytes, then ``crc32`` over those
    bytes as the frame's last field. A byte damaged anywhere in it (length included: the frame
    then ends elsewhere) fails ``unseal`` instead of reading as another valid request."""
    body = frame.SerializeToString()
    body += _SEAL_TAG + zlib.crc32(body).to_bytes(4, "little")
    return _LEN.pack(len(body)) + body


def unseal(body) -> bytes | None:
    """The frame bytes of a sealed frame's ``body`` (its bytes after the length) without the
    seal, or None when the seal is missing or does not match them."""
    if len(body) < SEAL_BYTES or body[-SEAL_BYTES:-4] != _SEAL_TAG:
        return None
    inner = bytes(body[:-SEAL_BYTES])
    return inner if zlib.crc32(inner) == int.from_bytes(body[-4:], "little") else None


def recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` completely from ``sock``."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerClosed(f"peer closed the connection after {got} of {n} bytes")
        got += k


def recv_frame(sock: socket.socket) -> pb.BulkFrame:
    """Read one frame header (not its payload).

    Raises:
        PeerClosed: clean EOF before a frame.
        ProtocolError: oversized or unparsable frame.
    """
    raw = bytearray(_LEN.size)
    recv_into(sock, memoryview(raw))
    (n,) = _LEN.unpack(raw)
    if n > MAX_FRAME:
        raise ProtocolError(f"frame header of {n} bytes exceeds the {MAX_FRAME}-byte limit: not a heterodata.v1 peer?")
    head = bytearray(n)
    recv_into(sock, memoryview(head))
    frame = pb.BulkFrame()
    try:
        frame.ParseFromString(bytes(head))
    except Exception as exc:  # protobuf raises DecodeError; anything else is garbage too
        raise ProtocolError(f"unparsable frame header ({n} bytes): {exc}") from None
    return frame


def token_proof(token: str, nonce: bytes) -> bytes:
    """HMAC-SHA256(token, nonce): proves the token without sending it."""
    return hmac.new(token.encode(), nonce, hashlib.sha256).digest()


def tune(sock: socket.socket) -> None:
    """No Nagle delay on small frames; buffer sizes left to the kernel's autotuning."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if os.environ.get("HETERO_SOCKBUF"):
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, int(os.environ["HETERO_SOCKBUF"]))


def host_key() -> str:
    """Equal on two processes that can open each other's /proc/<pid>/fd entries:
    same kernel boot, same pid namespace, same user."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{pidns}/{os.getuid()}"


def set_send_timeout(sock: socket.socket, seconds: float) -> None:
    """Make a blocking send fail after ``seconds`` without progress (a frozen or vanished peer),
    while receives stay blocking: a server's sender must not hold slots forever."""
    sec = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", sec, int((seconds - sec) * 1e6)))
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(seconds * 1000))
