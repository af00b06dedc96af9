"""Messages on the pipe between the worker pool (server side) and a data worker process.

Each message is a small typed tuple sent over a pipe to a process the server itself spawned;
nothing here ever crosses the network. ``MessageConnection`` packs the two messages every
batch costs (``TaskMsg`` and ``DoneMsg``) with ``struct``, which is several times cheaper than
pickling them; the rare ones (ready, imported, fatal, error, stop, promote) are pickled.
"""
from __future__ import annotations

import os
import pickle
import struct
from multiprocessing.connection import Connection
from typing import NamedTuple, Union

from ..contract.batch_id import BatchId
from ..protocol.generated import pb


class TaskMsg(NamedTuple):
    """Server -> worker: build ``batch`` into slot ``slot``."""

    task_id: int
    batch: BatchId  # packed flat, as its three integers (``encode``)
    slot: int
    renew: bool  # the slot's region was handed to a consumer for good: build into a new one


class StopMsg(NamedTuple):
    """Server -> worker: exit."""


class PromoteMsg(NamedTuple):
    """Server -> a spare worker (spare.py): you are worker ``wid`` now; tasks follow."""

    wid: int


SPARE_ID = -1            # the worker id a spare starts with, until a PromoteMsg gives it one
SPARE_COMM = "hetero-spare"  # a spare's process name (/proc/PID/comm) while it waits, for tools


class ReadyMsg(NamedTuple):
    """Worker -> server: the pipeline is loaded; ``info`` is its ``PipelineInfo`` (plan, finish stage).

    ``imported``: the modules the worker imported since it started, in order; ``hazard``: what it
    holds that a fork must not copy (a ``fork_safety.Hazards``), after importing them. A warm
    parent imports the first worker's too (preload.py), when the worker holds nothing unsafe.
    """

    pid: int
    info: object = None
    imported: tuple = ()
    hazard: object = None


class ImportedMsg(NamedTuple):
    """Worker -> server, once, after its first batch: the modules building it imported (as ``ReadyMsg``)."""

    names: tuple
    hazard: object = None


class FatalMsg(NamedTuple):
    """Worker -> server: the pipeline could not be loaded; the worker exits."""

    message: str
    traceback: str


class DoneMsg(NamedTuple):
    """Worker -> server: the batch of ``task_id`` is in slot ``slot``.

    ``new_region`` is ``(path, capacity)`` when the slot lives in a region the server has not
    opened yet (first use, grown, or renewed); ``header`` is a serialized ``BatchHeader``, sent
    on to the consumer as it is. The header's figures the server itself needs come beside it,
    so the server never parses it.
    """

    task_id: int
    slot: int
    new_region: tuple[str, int] | None
    header: bytes
    payload_bytes: int = 0
    raw_bytes: int = 0
    build_s: float = 0.0
    compress_s: float = 0.0
    samples_skipped: int = 0
    samples_reread: int = 0


class ErrorMsg(NamedTuple):
    """Worker -> server: building the batch of ``task_id`` failed."""

    task_id: int
    kind: pb.ErrorKind
    message: str
    traceback: str
    sample_index: int


ToWorker = Union[TaskMsg, StopMsg, PromoteMsg]
FromWorker = Union[ReadyMsg, FatalMsg, DoneMsg, ErrorMsg, ImportedMsg]

_TASK = struct.Struct("<cQQQQI?")           # tag, task_id, seed, epoch, index, slot, renew
_DONE = struct.Struct("<cQIQQQddIIH")       # tag, task_id, slot, region capacity, payload, raw, build_s,
                                            # compress_s, samples_skipped, samples_reread, region path length
_T, _D, _P = b"T", b"D", b"P"
_FRAME_LEN = struct.Struct("!i")  # multiprocessing's frame length
_READ_CHUNK = 1 << 16


def encode(msg) -> bytes:
    """The bytes of one message (see ``decode``)."""
    if type(msg) is TaskMsg:
        return _TASK.pack(_T, msg.task_id, msg.batch.seed, msg.batch.epoch, msg.batch.index, msg.slot, msg.renew)
    if type(msg) is DoneMsg:
        path, capacity = msg.new_region if msg.new_region is not None else ("", 0)
        raw_path = path.encode()
        return b"".join((_DONE.pack(_D, msg.task_id, msg.slot, capacity, msg.payload_bytes, msg.raw_bytes,
                                    msg.build_s, msg.compress_s, msg.samples_skipped, msg.samples_reread,
                                    len(raw_path)),
                         raw_path, msg.header))
    return _P + pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data) -> ToWorker | FromWorker:
    """The message in ``data`` (bytes from ``encode``, read from a pipe of our own process tree)."""
    tag = data[:1]
    if tag == _T:
        _, task_id, seed, epoch, index, slot, renew = _TASK.unpack(data)
        return TaskMsg(task_id, BatchId(seed, epoch, index), slot, renew)
    if tag == _D:
        _, task_id, slot, capacity, payload, raw, build_s, compress_s, skipped, reread, n = _DONE.unpack_from(data)
        start = _DONE.size
        region = (bytes(data[start:start + n]).decode(), capacity) if n else None
        return DoneMsg(task_id, slot, region, bytes(data[start + n:]), payload, raw, build_s, compress_s, skipped,
                       reread)
    if tag == _P:
        return pickle.loads(data[1:])
    raise ValueError(f"unknown worker pipe message tag {bytes(tag)!r}")


class MessageConnection(Connection):
    """A pipe end whose ``send``/``recv`` carry these messages (``encode``/``decode``).

    Frames are ``multiprocessing``'s (a 4-byte length, then the bytes). ``recv`` reads whatever
    the pipe holds in one call and keeps the rest for the next ``recv``; ``pending()`` says
    whether a whole message waits there, where no selector can see it.
    """

    _rbuf = b""

    def send(self, obj) -> None:
        self.send_frames(self.frame(obj))

    @staticmethod
    def frame(obj) -> bytes:
        """``obj`` as ``send`` writes it; join several and pass them to ``send_frames``."""
        data = encode(obj)
        return _FRAME_LEN.pack(len(data)) + data

    def send_frames(self, frames: bytes) -> None:
        """Write frames from ``frame`` in one call: the reader wakes once for all of them."""
        view = memoryview(frames)
        fd = self.fileno()
        while view:
            view = view[os.write(fd, view):]

    def pending(self) -> bool:
        buf = self._rbuf
        return len(buf) >= 4 and len(buf) - 4 >= _FRAME_LEN.unpack_from(buf)[0]

    def poll(self, timeout: float | None = 0.0) -> bool:
        return self.pending() or super().poll(timeout)

    def recv(self):
        buf, fd = self._rbuf, self.fileno()
        while True:
            if len(buf) >= 4:
                (n,) = _FRAME_LEN.unpack_from(buf)
                if len(buf) - 4 >= n:
                    self._rbuf = buf[4 + n:]
                    return decode(memoryview(buf)[4:4 + n])
            chunk = os.read(fd, max(_READ_CHUNK, 4 + (_FRAME_LEN.unpack_from(buf)[0] if len(buf) >= 4 else 0)
                                    - len(buf)))
            if not chunk:
                self._rbuf = b""
                raise EOFError("the pipe's other end closed")
            buf = buf + chunk if buf else chunk


def message_connection(conn: Connection) -> MessageConnection:
    """The same pipe as ``conn``, which is closed (its descriptor is duplicated first)."""
    duplicate = MessageConnection(os.dup(conn.fileno()), conn.readable, conn.writable)
    conn.close()
    return duplicate
