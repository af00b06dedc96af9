"""What the server makes of a data worker's messages: batches handed to their consumers, errors
reported, and each batch's slot given back when the consumer is done with it.

A worker reports a built batch with the slot it used (and a fresh region when it made one); the
server opens that region, marks the slot in use and hands the task's callback a ``Result``
whose bytes are a view of the slot. The ``Result`` gives the slot back through ``release``
(free again), ``retire`` (a consumer may still map it) or ``lease`` (a same-host consumer keeps
it zero-copy); after a release or retire the pool gives the workers more tasks. A batch whose
region the server cannot open is built again when its worker died, else reported.

Everything here shares the worker pool's lock (workers.py): the slot tables and the task maps
of the workers change under it only.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from .messages import DoneMsg, ErrorMsg
from .slots import ServerSlot
from .task_queue import TaskQueue
from .tasks import Result
from .lifecycle import WorkerHandle
from ..protocol.generated import pb

log = logging.getLogger(__name__)


class WorkerResults:
    """Reads the workers' messages for one pool and counts what they report; see the module docstring.

    Args:
        lock: the pool's lock.
        pending: the pool's waiting tasks; a batch to build again goes first in line.
        fail: ``fail(task, kind, message, traceback="", sample_index=-1)`` reports a failed task.
        on_death: called with a worker whose pipe broke.
        on_free: called after a slot was given back (the pool assigns tasks).
    """

    def __init__(self, lock: threading.Lock, pending: TaskQueue, fail: Callable[..., None],
                 on_death: Callable[[WorkerHandle], None], on_free: Callable[[], None]) -> None:
        self._lock = lock
        self._pending = pending
        self._fail = fail
        self._on_death = on_death
        self._on_free = on_free
        self.batches_built = 0
        self.batch_errors = 0
        self.samples_skipped = 0
        self.build_seconds = 0.0
        self.leases = 0
        self.retired = 0

    def on_message(self, w: WorkerHandle) -> None:
        """Read and handle one message from worker ``w``'s pipe."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            self._on_death(w)
            return
        if isinstance(msg, ErrorMsg):
            with self._lock:
                entry = w.tasks.pop(msg.task_id, None)
                if entry is None:
                    return  # stale
                task, k = entry
                w.table.unreserve(k)
                self.batch_errors += 1
            if not task.cancelled:
                self._fail(task, msg.kind, msg.message, msg.traceback, msg.sample_index)
            return
        if not isinstance(msg, DoneMsg):
            log.error("data worker %d sent an unexpected %s", w.wid, type(msg).__name__)
            return
        opened = None
        if msg.new_region is not None:
            # Opened before taking the task off the worker: until then no other task can be
            # given this slot, so the worker cannot replace the region under us.
            try:
                opened = ServerSlot(*msg.new_region, table=w.table)
            except OSError as exc:
                self._on_unmappable(w, msg.task_id, exc)
                return
        # One locked step from "the task is done" to "its slot is in use": other threads assign
        # tasks too (submit, release), and must never see the slot free while it holds this batch.
        with self._lock:
            entry = w.tasks.pop(msg.task_id, None)
            if entry is None:
                if opened is not None:
                    opened.close()
                return  # stale
            task, k = entry
            slot = w.table.fill(k, opened, msg.payload_bytes, task.owner)
            if slot is None:  # cannot happen unless slot bookkeeping is wrong: drop the batch, ask again
                log.error("data worker %d built into slot %d, which the server no longer has", w.wid, k)
                if not task.cancelled:
                    self._pending.appendleft(task)
                return
            self.batches_built += 1
            self.samples_skipped += msg.samples_skipped
            self.build_seconds += msg.build_s
        if task.cancelled:
            self._release(slot)
            return
        view = memoryview(slot.map)[:msg.payload_bytes]
        task.on_result(Result(task, msg.header, view, shm_path=slot.path, shm_size=slot.capacity,
                              shm_inode=slot.inode, payload_bytes=msg.payload_bytes, raw_bytes=msg.raw_bytes,
                              compress_s=msg.compress_s, _release=lambda: self._release(slot),
                              _retire=lambda: self._retire(slot), _lease=lambda: self._lease(slot)))

    def _on_unmappable(self, w: WorkerHandle, task_id: int, exc: OSError) -> None:
        """The server could not open the new region a batch was built into. Usually the worker
        died right after reporting it (the /proc path went with it): build the batch again
        elsewhere. A live worker means the server itself is short of something (descriptors)."""
        w.process.join(0.5)
        dead = w.process.exitcode is not None
        with self._lock:
            entry = w.tasks.pop(task_id, None)
            if entry is None:
                return  # stale
            task, k = entry
            w.table.unreserve(k, renew=True)  # the worker must report a fresh region for this slot
            if dead and not task.cancelled:
                self._pending.appendleft(task)
        if dead:
            log.warning("data worker %d died before its epoch %d batch %d could be mapped; building it again",
                        w.wid, task.epoch, task.index)
        elif not task.cancelled:
            self._fail(task, pb.INTERNAL,
                       f"data server could not map the batch data worker {w.wid} built ({exc}); "
                       "if it is out of file descriptors, raise the limit (ulimit -n)")

    # -- slots (through Result)
    def _lease(self, slot: ServerSlot) -> bool:
        with self._lock:
            granted = slot.table.lease(slot)
            if granted:
                self.leases += 1
            return granted is not False

    def _release(self, slot: ServerSlot) -> None:
        with self._lock:
            self._pending.forget(slot)
            slot.table.release(slot)
        self._on_free()

    def _retire(self, slot: ServerSlot) -> None:
        with self._lock:
            self._pending.forget(slot)
            slot.table.retire(slot)
            self.retired += 1
        self._on_free()
