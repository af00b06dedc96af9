"""Dispatching batch tasks to a pool of worker processes that build into shared-memory slots.

Each worker owns ``slots_per_worker`` output slots (slots.py). A worker builds a batch
straight into a free slot and tells the server; the server sends the slot's bytes to the
consumer and frees it. Workers only get a task when they have a free slot, so at most
``workers x slots`` built batches exist however slow the consumer is. No slot has a name in
/dev/shm, so a crash on either side leaks nothing.

Tasks go to workers on whichever thread makes room: the one submitting a request, the one
releasing a slot, or the one that reads the workers' pipes. That reader is either the pool's
own dispatcher thread (``start()``) or the data server's event loop (``start(own_thread=False)``,
which then polls ``wait_objects()`` and calls ``handle_ready``). A worker that dies
mid-batch is replaced (worker_lifecycle.py) and its batch rebuilt by another; user-code
exceptions travel back with their traceback and sample index.

Stuck batches: a consumer that stops taking its batches but stays connected (a training loop
paused for evaluation, an iterator broken off and not closed) would keep every slot it was
built into, and no other consumer would get a batch until its send timeout. So when a worker
has no free slot, another consumer is waiting, and a slot's batch has waited ``STUCK_S``, the
slot is detached (slots.py): the batch stays where it is for its consumer, the worker builds
into a fresh region, and the consumers whose batches are not stuck go first. At most
``detach_per_owner`` batches per consumer connection are detached at once: a consumer's default
window, so every batch a consumer asked for can be moved aside, which bounds the memory a
stalled consumer can pin to what it asked for. There is no cap over all connections together:
DDP ranks in lock step that got ahead hold their windows while they wait for the rank behind,
and that rank must still get the worker, or the whole job waits forever.

``Task`` and ``Result`` are tasks.py; the slot bookkeeping is slots.py; the pipe messages are
pool_messages.py.
"""
from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import os
import threading
import time
from multiprocessing.connection import wait as mp_wait
from typing import Callable

from . import worker_lifecycle
from .errors import ConfigError
from .pool_messages import DoneMsg, ErrorMsg, StopMsg, TaskMsg
from .slots import ServerSlot
from .tasks import Result, Task
from .worker_lifecycle import WorkerConfig, WorkerHandle
from .wire import pb

log = logging.getLogger(__name__)

TASKS_AHEAD = 2  # tasks a worker holds at once: it starts the next without a round trip to us
MAX_ATTEMPTS = 3  # a batch that kills this many workers is reported, not retried forever
STUCK_S = 0.25    # a built batch nobody took for this long may be moved out of its worker's way
DETACH_PER_OWNER = 8  # detached batches one consumer connection may hold at once, at least (see detach_per_owner)


class WorkerPool:
    """Runs a pipeline in ``num_workers`` processes; see the module docstring."""

    def __init__(self, spec_json: str, num_workers: int, slots_per_worker: int = 2,
                 start_timeout: float = 120.0, log_level: int = logging.INFO, codec: str = "", nice: int = 0) -> None:
        if num_workers < 1:
            raise ConfigError(f"num_workers={num_workers} must be >= 1")
        if slots_per_worker < 1:
            raise ConfigError(f"slots_per_worker={slots_per_worker} must be >= 1")
        self._cfg = WorkerConfig(spec_json, slots_per_worker, start_timeout, log_level, codec, nice)
        self._num_workers = num_workers
        # A consumer's default window is max(4, 2 x workers), 8 while batches are small
        # (dnn_worker/remote_dataset.py): that many of its batches may be moved aside.
        self.detach_per_owner = max(DETACH_PER_OWNER, 2 * num_workers)
        self._ctx = mp.get_context("spawn")
        self._lock = threading.Lock()
        self._pending: collections.deque[Task] = collections.deque()
        self._workers: list[WorkerHandle] = []
        self._spawned_at = 0.0  # when spawn() started them
        self._gone: list[WorkerHandle] = []  # replaced workers whose pipes a poller may still watch
        self._next_id = 1
        self.info = None  # the PipelineInfo the workers reported (start())
        self._stopping = False
        self._replacing = 0   # replacement threads running
        self.no_workers = ""  # why no worker is left (every replacement failed); submits fail at once
        self.on_no_workers: Callable[[str], None] | None = None  # the server turns unhealthy
        self.generation = 0   # changes whenever wait_objects() would change
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._thread: threading.Thread | None = None
        self.started_at = time.monotonic()
        self.batches_built = 0
        self.batch_errors = 0
        self.samples_skipped = 0
        self.build_seconds = 0.0
        self.restarts = 0
        self.failed_replacements = 0
        self.leases = 0
        self.retired = 0
        self.detached = 0  # batches ever detached
        self._detached: set[ServerSlot] = set()  # slots detached from their worker, not yet released

    # -- lifecycle
    def spawn(self) -> None:
        """Start the worker processes, all at once, without waiting for them (``start`` waits): they
        load the pipeline while the caller goes on (a data server's main process imports the
        builder's module meanwhile). Once only."""
        if not self._workers:
            self._workers = [worker_lifecycle.spawn(self._ctx, w, self._cfg) for w in range(self._num_workers)]
            self._spawned_at = time.monotonic()

    def start(self, own_thread: bool = True) -> None:
        """Start the workers; wait until each has loaded the pipeline; ``info`` is then what they
        reported (the plan and finish stage).

        Args:
            own_thread: read the workers' pipes on a dispatcher thread of the pool's own. False:
                the caller's event loop does, through ``wait_objects`` and ``handle_ready``.

        Raises:
            ConfigError: a worker could not load the pipeline (with its traceback).
        """
        self.spawn()
        deadline = self._spawned_at + self._cfg.start_timeout  # they load side by side
        try:
            for k in range(len(self._workers)):
                worker_lifecycle.start_with_retry(self._ctx, self._workers, k, deadline, self._cfg,
                                                  self._count_restart)
        except ConfigError:
            self.stop(0)
            raise
        infos = [w.info for w in self._workers]
        if any(i != infos[0] for i in infos):
            self.stop(0)
            raise ConfigError(f"the data workers built different pipelines from one spec ({infos}); the builder "
                              "must depend on its options only (not on the process, the time or a changing folder)")
        self.info = infos[0]
        self.started_at = time.monotonic()
        self.generation += 1
        if own_thread:
            self._thread = threading.Thread(target=self._loop, name="worker-pool", daemon=True)
            self._thread.start()

    def _count_restart(self) -> None:
        self.restarts += 1

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every worker (politely, then SIGKILL after ``timeout``)."""
        with self._lock:
            self._stopping = True
            pending = list(self._pending)
            self._pending.clear()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(timeout, 1.0))
        for w in self._workers:
            try:
                w.conn.send(StopMsg())
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout
        for w in self._workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(2.0)
        for task in pending:
            self._fail(task, pb.SHUTTING_DOWN, "data server is shutting down; ask another server")

    # -- public API
    def submit(self, task: Task) -> Task:
        with self._lock:
            refusal = ("data server is shutting down; ask another server" if self._stopping
                       else self.no_workers)
            if not refusal:
                task.id = self._next_id
                self._next_id += 1
                self._pending.append(task)
        if refusal:
            self._fail(task, pb.SHUTTING_DOWN, refusal)
        else:
            self._assign()  # on this thread: waking the dispatcher costs more than the send
        return task

    def cancel(self, tasks) -> None:
        with self._lock:
            for t in tasks:
                t.cancelled = True

    @property
    def queue_depth(self) -> int:
        with self._lock:
            return len(self._pending) + sum(len(w.tasks) for w in self._workers)

    def slots_in_use(self) -> tuple[int, int]:
        with self._lock:
            used = [s for w in self._workers for s in w.table.in_use()] + list(self._detached)
            return len(used), sum(s.used_bytes for s in used)

    def busy_fraction(self) -> float:
        elapsed = max(time.monotonic() - self.started_at, 1e-9)
        return min(1.0, self.build_seconds / (elapsed * self._num_workers))

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.alive]

    # -- polling (the dispatcher thread, or the server's event loop)
    def wait_objects(self) -> list:
        """What to poll: the wake pipe, then each live worker's pipe and process sentinel.

        Also forgets replaced workers: a poller calls this after dropping what it watched before.
        """
        with self._lock:
            self._gone.clear()
            live = [w for w in self._workers if w.alive]
        return [self._wake_r] + [w.conn for w in live] + [w.process.sentinel for w in live]

    def handle_ready(self, ready) -> None:
        """Handle objects from ``wait_objects`` that are ready to read."""
        with self._lock:
            workers = list(self._workers)
        for obj in ready:
            if obj == self._wake_r:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
                continue
            for w in workers:
                if obj is w.conn:
                    while w.alive:  # also the messages the last read took off the pipe with it
                        self._on_message(w)
                        if not w.conn.pending():
                            break
                elif obj == w.process.sentinel and w.alive and not w.conn.poll():
                    self._on_death(w)
        self._assign()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _loop(self) -> None:
        while True:
            try:
                with self._lock:
                    if self._stopping:
                        return
                self._assign()
                self.handle_ready(mp_wait(self.wait_objects(), timeout=0.5))
            except Exception:  # a bug here must not silently stop every batch of every consumer
                log.exception("worker pool dispatcher error (continuing)")
                time.sleep(0.1)

    # -- dispatch
    def _fail(self, task: Task, kind: int, message: str, tb: str = "", sample: int = -1) -> None:
        err = pb.BatchError(ref=pb.BatchRef(seed=task.seed, epoch=task.epoch, index=task.index),
                            kind=kind, message=message, traceback=tb, sample_index=sample)
        task.on_result(Result(task, error=err))

    def tick(self) -> None:
        """Called now and then by the loop that polls the pool: batches become stuck as time passes."""
        self._assign()

    def _assign(self) -> None:
        with self._lock:
            for w in self._workers:
                frames = b""  # this worker's new tasks, in one write: one wake-up of the worker
                while self._pending and w.alive and w.ready and len(w.tasks) < TASKS_AHEAD:
                    while self._pending and self._pending[0].cancelled:
                        self._pending.popleft()
                    if not self._pending:
                        break
                    free = w.table.reserve()
                    if free is not None:
                        task = self._take()
                    else:
                        made = self._make_room(w)
                        if made is None:
                            break
                        task, free = made
                    k, renew = free
                    w.tasks[task.id] = (task, k)
                    frames += w.conn.frame(TaskMsg(task.id, task.seed, task.epoch, task.index, k, renew))
                if frames:
                    try:
                        w.conn.send_frames(frames)
                    except (OSError, ValueError):
                        pass  # the sentinel reports the death

    def _take(self) -> Task:
        """The next task (the head is not cancelled): the oldest one, except that consumers with
        stuck batches wait behind those without."""
        if self._detached:
            stuck = {s.owner for s in self._detached}
            for i, t in enumerate(self._pending):
                if not t.cancelled and t.owner not in stuck:
                    del self._pending[i]
                    return t
        return self._pending.popleft()

    def _make_room(self, w: WorkerHandle) -> tuple[Task, tuple[int, bool]] | None:
        """Worker ``w`` has no free slot: detach its oldest stuck batch for which a task of another
        consumer is waiting; returns that task and the freed slot (module docstring)."""
        cap = self.detach_per_owner
        for slot in w.table.stuck(time.monotonic() - STUCK_S):
            if sum(s.owner is slot.owner for s in self._detached) >= cap:
                continue
            for i, t in enumerate(self._pending):
                if not t.cancelled and t.owner is not slot.owner:
                    w.table.detach(slot)
                    self._detached.add(slot)
                    self.detached += 1
                    free = w.table.reserve()
                    if free is None:  # cannot happen: detaching frees a slot
                        return None
                    del self._pending[i]
                    return t, free
            # Every waiting task is this slot's consumer's own (it holds a batch that came early
            # while it waits for an earlier one): a younger slot of another consumer may free it.
        return None

    def _on_message(self, w: WorkerHandle) -> None:
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
            self._detached.discard(slot)
            slot.table.release(slot)
        self._assign()

    def _retire(self, slot: ServerSlot) -> None:
        with self._lock:
            self._detached.discard(slot)
            slot.table.retire(slot)
            self.retired += 1
        self._assign()

    # -- deaths and replacements
    def _check_workers_left(self, last_error: str) -> None:
        """After a replacement failed for good: with no worker alive and none being replaced, fail
        what is queued and every later request (consumers ask other servers) and tell the server."""
        with self._lock:
            # > 1: the replacement thread calling this still counts itself
            if self._stopping or any(w.alive for w in self._workers) or self._replacing > 1:
                return
            self.no_workers = (f"data server has no data worker left (replacing them failed: {last_error}); "
                               "ask another server")
            pending = list(self._pending)
            self._pending.clear()
        for task in pending:
            if not task.cancelled:
                self._fail(task, pb.SHUTTING_DOWN, self.no_workers)
        if self.on_no_workers is not None:
            self.on_no_workers(self.no_workers)

    def _on_death(self, w: WorkerHandle) -> None:
        with self._lock:
            if not w.alive:
                return
            w.alive = False
            self.generation += 1
            tasks = [t for t, _ in w.tasks.values()]
            w.tasks.clear()
            w.table.orphan_all()  # slots holding built batches close when those are released
            stopping = self._stopping
            self._replacing += not stopping  # counted with the death, so no one sees a gap
        task = tasks[0] if tasks else None  # the one it was building; the rest were queued behind it
        code = w.process.exitcode
        log.warning("data worker %d (pid %s) died with exit code %s%s", w.wid, w.process.pid, code,
                    f" while building epoch {task.epoch} batch {task.index}" if task else "")
        if task is not None and not task.cancelled:
            task.attempts += 1
            if task.attempts >= MAX_ATTEMPTS:
                self._fail(task, pb.INTERNAL,
                           f"{task.attempts} data workers died building this batch (last exit code {code}); "
                           "the pipeline crashes the process on it (segfault or out of memory?)")
                tasks = tasks[1:]
        with self._lock:
            self._pending.extendleft(t for t in reversed(tasks) if not t.cancelled)
        if not stopping:
            # Replace it off the polling thread: a spawn takes seconds.
            threading.Thread(target=self._replace, args=(w,), name="worker-replace", daemon=True).start()

    def _replace(self, dead: WorkerHandle) -> None:
        try:
            try:
                replacement = worker_lifecycle.spawn_replacement(self._ctx, dead.wid, self._cfg,
                                                                 lambda: self._stopping)
            except ConfigError as exc:
                self.failed_replacements += 1
                self._check_workers_left(str(exc))
                return
            if replacement is None:
                return
            with self._lock:
                if self._stopping:
                    replacement.conn.send(StopMsg())
                    self._workers.append(replacement)  # stop() joins it
                    return
                self._workers[self._workers.index(dead)] = replacement
                self._gone.append(dead)  # its pipe closes once pollers stopped watching it
                self.generation += 1
                self.restarts += 1
            self._wake()
        finally:
            with self._lock:
                self._replacing -= 1
