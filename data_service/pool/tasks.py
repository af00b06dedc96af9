"""A batch task given to the worker pool, and the result it comes back with."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..contract.batch_id import BatchId
from ..protocol.generated import pb


@dataclass
class Task:
    """One batch to build (``batch``); ``on_result`` is called once, from the pool's thread.

    ``owner`` (the consumer connection that asked) lets the pool keep one consumer that stopped
    taking its batches from holding every worker's slots (task_queue.py, "stuck batches").
    """

    batch: BatchId
    on_result: Callable[["Result"], None]
    owner: object = None
    id: int = 0
    attempts: int = 0
    cancelled: bool = False


@dataclass
class Result:
    """A built batch (``header_bytes``, the slot's ``payload``) or an ``error``.

    ``header_bytes`` is the serialized ``BatchHeader`` as the worker made it; the server sends it
    on without parsing it, using the figures beside it (``payload_bytes`` and so on).
    """

    task: Task
    header_bytes: bytes = b""
    payload: memoryview | None = None
    error: pb.BatchError | None = None
    shm_path: str = ""
    shm_size: int = 0
    shm_inode: int = 0
    payload_bytes: int = 0
    raw_bytes: int = 0
    compress_s: float = 0.0
    _release: Callable[[], None] | None = field(default=None, repr=False)
    _retire: Callable[[], None] | None = field(default=None, repr=False)
    _lease: Callable[[], bool] | None = field(default=None, repr=False)

    @property
    def header(self) -> pb.BatchHeader | None:
        """The parsed header (None for an error); parsed on each call, for the rare reader."""
        return pb.BatchHeader.FromString(self.header_bytes) if self.error is None else None

    def lease(self) -> bool:
        """Shared-memory mode: may the consumer keep the slot (zero copy) until it drops the batch?

        Granted while the slot's worker keeps at least one slot without a lease, so
        batches a consumer holds on to can slow the worker down but never stall it.
        """
        return self._lease() if self._lease is not None else False

    def release(self) -> None:
        """Give the slot back to its worker, after sending ``payload``; later release/retire calls do nothing."""
        self._end(self._release)

    def retire(self) -> None:
        """Like ``release``, for a slot a consumer may still map (its connection ended while it
        held the batch): the region is never written again; its worker gets a fresh one."""
        self._end(self._retire)

    def _end(self, action: Callable[[], None] | None) -> None:
        if self.payload is not None:
            self.payload.release()
            self.payload = None
        self._release = self._retire = None  # whichever comes first is the only one
        if action is not None:
            action()
