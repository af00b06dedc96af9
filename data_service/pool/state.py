"""The worker pool's state, and the events that change it, behind one lock.

``PoolState`` owns everything of a pool that changes while it serves: the waiting tasks
(task_queue.py), the worker handles with their slot tables (slots.py) and task maps, whether
the pool is stopping or has no worker left, the replacements under way, the poll generation,
the task ids and every counter. Its public methods are the pool's events; each takes the lock
once, and they are the only code that writes that state. None of them calls out while it
decides: each returns what is left to do outside the lock (tasks to fail, a batch to hand
over, frames to send, a worker to replace; results.py), and the worker pool (worker_pool.py)
does it. The task queue and slot tables hold no lock of their own: only this class calls them.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import cast

from .lifecycle import WorkerHandle, WorkerProcess
from .messages import DoneMsg, ErrorMsg, TaskMsg
from .results import SHUTTING_DOWN, Death, Failure, GaveUp, no_workers_left, unmappable
from .slots import ServerSlot
from .task_queue import TaskQueue
from .tasks import Task
from ..protocol.generated import pb

log = logging.getLogger(__name__)

TASKS_AHEAD = 2  # tasks a worker holds at once: it starts the next without a round trip to us
MAX_ATTEMPTS = 3  # a batch that kills this many workers is reported, not retried forever


@dataclass
class PoolCounts:
    """What one pool did, for the server's stats."""

    # batches the workers reported
    batches_built: int = 0
    batch_errors: int = 0
    samples_skipped: int = 0
    samples_reread: int = 0  # samples read again after a checksum failure (recovered from the source)
    build_seconds: float = 0.0
    # slots a consumer kept zero-copy, and slots never written again (a consumer may still map them)
    leases: int = 0
    retired: int = 0
    restarts: int = 0  # workers started again (at start-up after dying while loading, or replaced)

    def built(self, msg: DoneMsg) -> None:
        """Count a batch a worker reported built, with the figures it sent along."""
        self.batches_built += 1
        self.samples_skipped += msg.samples_skipped
        self.samples_reread += msg.samples_reread
        self.build_seconds += msg.build_s


class PoolState:
    """One pool's mutable state and its events; see the module docstring.

    The flags (``stopping``, ``no_workers``, ``replacing``, ``generation``) and ``counts`` are
    plain attributes that anyone may read; only the events write them.
    """

    def __init__(self, num_workers: int) -> None:
        self._lock = threading.Lock()
        self._queue = TaskQueue(num_workers)
        self._workers: list[WorkerHandle] = []
        self._gone: list[WorkerHandle] = []  # replaced workers whose pipes a poller may still watch
        self._next_id = 1
        self.stopping = False
        self.no_workers = ""  # why no worker is left (every replacement failed); submits fail at once
        self.replacing = 0   # replacements under way
        self.generation = 0  # changes whenever poll_objects() would change
        self.counts = PoolCounts()

    # -- start-up (the starting thread)
    def workers_spawned(self, handles: list[WorkerHandle]) -> None:
        """The worker processes were started; they load the pipeline."""
        with self._lock:
            self._workers = list(handles)

    def worker_respawned(self, k: int, new: WorkerHandle) -> None:
        """Worker ``k`` died while loading and ``new`` was started in its place."""
        with self._lock:
            self._workers[k] = new
            self.counts.restarts += 1

    def workers_ready(self) -> None:
        """Every worker loaded the pipeline: they may get tasks."""
        with self._lock:
            for w in self._workers:
                w.ready = True
            self.generation += 1

    # -- tasks (any thread)
    def submit(self, task: Task) -> list[Failure]:
        """A new task, last in line; or refused (returned) while stopping or with no worker left."""
        with self._lock:
            refusal = SHUTTING_DOWN if self.stopping else self.no_workers
            if not refusal:
                task.id = self._next_id
                self._next_id += 1
                self._queue.append(task)
                return []
        return [Failure(task, pb.SHUTTING_DOWN, refusal)]

    def cancel(self, tasks) -> None:
        with self._lock:
            for t in tasks:
                t.cancelled = True

    def assign(self) -> list[tuple[WorkerHandle, bytes]]:
        """Give waiting tasks to workers with room; returns each worker's new task frames, to be
        sent in one write (one wake-up of the worker), in the order they were given."""
        sends = []
        with self._lock:
            for w in self._workers:
                frames = b""
                while self._queue and w.alive and w.ready and len(w.tasks) < TASKS_AHEAD:
                    made = self._queue.next_for(w.table)
                    if made is None:
                        break
                    task, (k, renew) = made
                    w.tasks[task.id] = (task, k)
                    frames += w.conn.frame(TaskMsg(task.id, task.batch, k, renew))
                if frames:
                    sends.append((w, frames))
        return sends

    def stop(self) -> list[Failure]:
        """The pool stops: every later submit is refused; returns the waiting tasks to fail."""
        with self._lock:
            self.stopping = True
            pending = self._queue.drain()
        return [Failure(t, pb.SHUTTING_DOWN, SHUTTING_DOWN) for t in pending]

    # -- what the workers report (the polling thread)
    def batch_built(self, w: WorkerHandle, msg: DoneMsg,
                    opened: ServerSlot | None) -> tuple[Task, ServerSlot] | None:
        """Worker ``w`` built a batch (into ``opened``, the region it reported, when new); returns
        the task and its slot, now in use, to hand over, or None (stale, cancelled, to build again).
        One locked step from "done" to "in use": no thread may see the slot free while it holds a batch."""
        with self._lock:
            entry = w.tasks.pop(msg.task_id, None)
            if entry is None:
                if opened is not None:
                    opened.close()
                return None
            task, k = entry
            slot = w.table.fill(k, opened, msg.payload_bytes, task.owner)
            if slot is None:  # cannot happen unless slot bookkeeping is wrong: drop the batch, ask again
                log.error("data worker %d built into slot %d, which the server no longer has", w.wid, k)
                if not task.cancelled:
                    self._queue.appendleft(task)
                return None
            self.counts.built(msg)
            if task.cancelled:
                self._free(slot)
                return None
            return task, slot

    def batch_failed(self, w: WorkerHandle, msg: ErrorMsg) -> list[Failure]:
        """Worker ``w`` could not build a batch (the pipeline raised)."""
        with self._lock:
            entry = w.tasks.pop(msg.task_id, None)
            if entry is None:
                return []  # stale
            task, k = entry
            w.table.unreserve(k)
            self.counts.batch_errors += 1
            if task.cancelled:
                return []
        return [Failure(task, msg.kind, msg.message, msg.traceback, msg.sample_index)]

    def region_reported(self, w: WorkerHandle, task_id: int) -> None:
        """Worker ``w`` built task ``task_id``'s batch into a region the server could not open
        (``region_unmappable`` decides later): should ``w`` die meanwhile, that batch did not kill it."""
        with self._lock:
            if task_id in w.tasks:
                w.reported.add(task_id)

    def region_unmappable(self, w: WorkerHandle, task_id: int, dead: bool,
                          error: str) -> tuple[Task | None, list[Failure]]:
        """The server could not open the new region worker ``w`` built a batch into (``error``). A
        ``dead`` worker took it along (the /proc path went with it): the batch is built again
        elsewhere. Returns the task (None when stale) and what to fail."""
        with self._lock:
            w.reported.discard(task_id)
            entry = w.tasks.pop(task_id, None)
            if entry is None:
                return None, []
            task, k = entry
            w.table.unreserve(k, renew=True)  # the worker must report a fresh region for this slot
            if task.cancelled:
                return task, []
            if dead:
                self._queue.appendleft(task)
                return task, []
        return task, [unmappable(task, w.wid, error)]

    def worker_died(self, w: WorkerHandle) -> Death | None:
        """Worker ``w``'s process ended or its pipe broke (None: already handled). Its slots close once
        released; its tasks go first in line again, but one that killed ``MAX_ATTEMPTS`` workers fails."""
        with self._lock:
            if not w.alive:
                return None
            w.alive = False
            self.generation += 1
            tasks = [t for t, _ in w.tasks.values()]
            # the first it had not reported built; the rest were queued behind it
            building = next((t for tid, (t, _) in w.tasks.items() if tid not in w.reported), None)
            w.tasks.clear()
            w.reported.clear()
            w.table.orphan_all()
            replace = not self.stopping
            self.replacing += replace  # counted with the death, so no one sees a gap
            crashed = []
            if building is not None and not building.cancelled:
                building.attempts += 1
                if building.attempts >= MAX_ATTEMPTS:
                    crashed.append(building)
                    tasks = [t for t in tasks if t is not building]
            self._queue.extendleft(t for t in reversed(tasks) if not t.cancelled)
        return Death(building, crashed, replace)

    # -- replacements (a replacement thread)
    def worker_replaced(self, dead: WorkerHandle, new: WorkerHandle | None) -> bool:
        """A replacement of ``dead`` ended with ``new`` ready (or None). True: ``new`` serves in its
        place (the poller must look again); False: none, or the pool is stopping (tell ``new`` to stop)."""
        with self._lock:
            self.replacing -= 1
            if new is None:
                return False
            if self.stopping:
                self._workers.append(new)
                return False
            new.ready = True
            self._workers[self._workers.index(dead)] = new
            self._gone.append(dead)  # its pipe closes once pollers stopped watching it
            self.generation += 1
            self.counts.restarts += 1
            return True

    def replacement_gave_up(self, error: str) -> GaveUp:
        """Every attempt to replace a worker failed. With no worker alive and none being replaced,
        the queued tasks and every later one fail (consumers ask other servers)."""
        with self._lock:
            self.replacing -= 1
            if self.stopping or self.replacing or any(w.alive for w in self._workers):
                return GaveUp([], "")
            self.no_workers = no_workers_left(error)
            pending = self._queue.drain()
        return GaveUp([Failure(t, pb.SHUTTING_DOWN, self.no_workers) for t in pending if not t.cancelled],
                      self.no_workers)

    def workers_ended(self) -> list[WorkerHandle]:
        """The pool stopped every worker process: their regions close once released; returns the handles."""
        with self._lock:
            for w in self._workers:
                w.table.orphan_all()
            return list(self._workers)

    # -- slots (whichever thread a Result is given back on)
    def release(self, slot: ServerSlot) -> None:
        """The batch in ``slot`` was sent or copied out: the slot is free again."""
        with self._lock:
            self._free(slot)

    def retire(self, slot: ServerSlot) -> None:
        """A consumer may still map ``slot``: never write it again."""
        with self._lock:
            self._queue.forget(slot)
            slot.table.retire(slot)
            self.counts.retired += 1

    def lease(self, slot: ServerSlot) -> bool:
        """May a same-host consumer keep ``slot`` zero-copy until it drops the batch?"""
        with self._lock:
            granted = slot.table.lease(slot)
            self.counts.leases += granted is True  # None: it held the lease already
            return granted is not False

    def _free(self, slot: ServerSlot) -> None:  # under the lock
        self._queue.forget(slot)
        slot.table.release(slot)

    # -- readers
    def workers(self) -> list[WorkerHandle]:
        """The worker handles, live and dead, as they are now."""
        with self._lock:
            return list(self._workers)

    def poll_objects(self) -> list[object]:
        """Each live worker's pipe, then each one's process sentinel. Forgets replaced workers too:
        a poller calls this after dropping what it watched before."""
        with self._lock:
            self._gone.clear()
            live = [w for w in self._workers if w.alive]
        conns: list[object] = [w.conn for w in live]
        return conns + [cast(WorkerProcess, w.process).sentinel for w in live]  # live ones were launched

    def pids(self) -> list[int]:
        with self._lock:  # launched, so started: each has a pid
            return cast("list[int]", [w.process.pid for w in self._workers if w.alive and w.process is not None])

    @property
    def queue_depth(self) -> int:
        with self._lock:
            return len(self._queue) + sum(len(w.tasks) for w in self._workers)

    def slots_in_use(self) -> tuple[int, int]:
        """Slots holding a batch (with the detached ones), and their bytes."""
        with self._lock:
            used = [s for w in self._workers for s in w.table.in_use()] + self._queue.detached_slots()
            return len(used), sum(s.used_bytes for s in used)
