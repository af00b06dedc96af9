"""A pool of worker processes that build batches into shared-memory slots.

Each worker owns ``slots_per_worker`` output slots: anonymous memfd regions the
server maps through ``/proc/<pid>/fd/<n>``. A worker builds a batch straight
into a free slot and tells the server; the server sends the slot's bytes to the
consumer and frees it. Workers only get a task when they have a free slot, so
at most ``workers x slots`` built batches exist however slow the consumer is.
No slot has a name in /dev/shm, so a crash on either side leaks nothing.

Tasks go to workers on whichever thread makes room: the one submitting a request, the
one releasing a slot, or the dispatcher thread, which also takes results and deaths.
A worker that dies mid-batch is replaced and its batch rebuilt by another;
user-code exceptions travel back with their traceback and sample index. A worker
that dies while the server starts is started again; the worker process itself
is worker_process.py.
"""
from __future__ import annotations

import collections
import logging
import mmap
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait as mp_wait
from typing import Callable

from .errors import ConfigError
from .worker_process import worker_main
from .wire import pb

log = logging.getLogger(__name__)

TASKS_AHEAD = 2  # tasks a worker holds at once: it starts the next without a round trip to us
MAX_ATTEMPTS = 3  # a batch that kills this many workers is reported, not retried forever
RESPAWN_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 5.0, 5.0)  # between attempts to replace a dead worker
STARTUP_RETRY_S = (0.5, 1.0, 2.0)  # between start-up attempts of a worker that died while loading


class _DiedLoading(ConfigError):
    """A worker process ended before it said ready, without a Python error: killed, out of memory."""


@dataclass
class Task:
    """One batch to build; ``on_result`` is called once, from the pool's thread."""

    seed: int
    epoch: int
    index: int
    on_result: Callable[["Result"], None]
    id: int = 0
    attempts: int = 0
    cancelled: bool = False


@dataclass
class Result:
    task: Task
    header: pb.BatchHeader | None = None
    payload: memoryview | None = None
    error: pb.BatchError | None = None
    shm_path: str = ""
    shm_size: int = 0
    shm_inode: int = 0
    _release: Callable[[], None] | None = field(default=None, repr=False)
    _retire: Callable[[], None] | None = field(default=None, repr=False)
    _lease: Callable[[], bool] | None = field(default=None, repr=False)

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


class _ServerSlot:
    def __init__(self, path: str, capacity: int, worker: "_Worker") -> None:
        # Our own descriptor keeps the region reachable at /proc/<server pid>/fd/<fd>
        # for consumers on this host (shared-memory mode), even if the worker dies.
        self.fd = os.open(path, os.O_RDWR)
        self.capacity = capacity
        self.map = mmap.mmap(self.fd, capacity)
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.inode = os.fstat(self.fd).st_ino  # fd numbers are reused; inodes of live memfds are not
        self.worker = worker
        self.in_use = False
        self.orphan = False
        self.leased = False
        self.used_bytes = 0

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:
            pass  # a view is still exported; the map goes when it is collected
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Worker:
    def __init__(self, wid: int, process, conn, num_slots: int) -> None:
        self.wid = wid
        self.process = process
        self.conn = conn
        self.slots: list[_ServerSlot | None] = [None] * num_slots
        self.tasks: dict[int, tuple[Task, int]] = {}  # task id -> (task, slot), in the order sent
        self.ready = False
        self.alive = True
        self.leased = 0            # slots a consumer holds zero-copy
        self.renew: set[int] = set()  # slots to rebuild in a fresh region (retired)

    def free_slot(self) -> int:
        taken = {k for _, k in self.tasks.values()}
        for k, s in enumerate(self.slots):
            if k not in taken and (s is None or not s.in_use):
                return k
        return -1


class WorkerPool:
    """Runs a pipeline in ``num_workers`` processes; see the module docstring."""

    def __init__(self, spec_json: str, num_workers: int, slots_per_worker: int = 2,
                 start_timeout: float = 120.0, log_level: int = logging.INFO, codec: str = "") -> None:
        if num_workers < 1:
            raise ConfigError(f"num_workers={num_workers} must be >= 1")
        if slots_per_worker < 1:
            raise ConfigError(f"slots_per_worker={slots_per_worker} must be >= 1")
        self._spec_json = spec_json
        self._num_workers = num_workers
        self._num_slots = slots_per_worker
        self._start_timeout = start_timeout
        self._log_level = log_level
        self._codec = codec
        self._ctx = mp.get_context("spawn")
        self._lock = threading.Lock()
        self._pending: collections.deque[Task] = collections.deque()
        self._workers: list[_Worker] = []
        self._next_id = 1
        self._stopping = False
        self._replacing = 0   # replacement threads running
        self.no_workers = ""  # why no worker is left (every replacement failed); submits fail at once
        self.on_no_workers: Callable[[str], None] | None = None  # the server turns unhealthy
        self._wake_r, self._wake_w = os.pipe()
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

    # -- lifecycle
    def start(self) -> None:
        """Start the workers; wait until each has loaded the pipeline.

        Raises:
            ConfigError: a worker could not load the pipeline (with its traceback).
        """
        self._workers = [self._spawn(w) for w in range(self._num_workers)]
        deadline = time.monotonic() + self._start_timeout  # they load side by side
        try:
            for k in range(len(self._workers)):
                self._start_or_retry(k, deadline)
        except ConfigError:
            self.stop(0)
            raise
        self.started_at = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="worker-pool", daemon=True)
        self._thread.start()

    def _spawn(self, wid: int) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=worker_main, name=f"hetero-data-worker-{wid}", daemon=True,
            args=(child, self._spec_json, wid, self._num_slots, os.getpid(), self._log_level, self._codec))
        proc.start()
        child.close()
        return _Worker(wid, proc, parent, self._num_slots)

    def _start_or_retry(self, k: int, deadline: float) -> None:
        """Wait until worker ``k`` is ready. One that dies while loading (killed, out of memory)
        is started again a few times; one whose pipeline raised is not (it would raise again)."""
        for attempt, pause in enumerate(STARTUP_RETRY_S + (None,)):
            w = self._workers[k]
            try:
                self._await_ready(w, deadline)
                return
            except _DiedLoading as exc:
                if pause is None:
                    raise ConfigError(f"{exc}; gave up after {attempt + 1} attempts (is the node out of memory?)") from None
                log.warning("%s; starting it again in %.1fs", exc, pause)
            w.process.join(1.0)
            time.sleep(pause)
            self._workers[k] = self._spawn(w.wid)  # before the wait: stop() must see it if we give up
            self.restarts += 1
            deadline = time.monotonic() + self._start_timeout

    def _await_ready(self, w: _Worker, deadline: float) -> None:
        """Raises ConfigError (pipeline failed to load, or too slow) or _DiedLoading."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConfigError(
                    f"data worker {w.wid} did not load the pipeline within {self._start_timeout:.0f}s; "
                    "raise the start-up timeout or make the pipeline builder faster")
            if w.conn.poll(min(left, 0.5)):
                try:
                    msg = w.conn.recv()
                except EOFError:
                    w.process.join(1.0)
                    raise _DiedLoading(f"data worker {w.wid} exited with code {w.process.exitcode} "
                                       "while loading the pipeline") from None
                if msg[0] == "ready":
                    w.ready = True
                    return
                raise ConfigError(f"data worker could not load the pipeline: {msg[1]}\n{msg[2]}")
            if not w.process.is_alive() and not w.conn.poll():
                raise _DiedLoading(f"data worker {w.wid} exited with code {w.process.exitcode} "
                                   "while loading the pipeline")

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
                w.conn.send(("stop",))
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
            used = [s for w in self._workers for s in w.slots if s is not None and s.in_use]
            return len(used), sum(s.used_bytes for s in used)

    def busy_fraction(self) -> float:
        elapsed = max(time.monotonic() - self.started_at, 1e-9)
        return min(1.0, self.build_seconds / (elapsed * self._num_workers))

    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.alive]

    # -- dispatcher
    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _fail(self, task: Task, kind: int, message: str, tb: str = "", sample: int = -1) -> None:
        err = pb.BatchError(ref=pb.BatchRef(seed=task.seed, epoch=task.epoch, index=task.index),
                            kind=kind, message=message, traceback=tb, sample_index=sample)
        task.on_result(Result(task, error=err))

    def _assign(self) -> None:
        with self._lock:
            for w in self._workers:
                while self._pending and w.alive and w.ready and len(w.tasks) < TASKS_AHEAD:
                    k = w.free_slot()
                    if k < 0:
                        break
                    task = self._pending.popleft()
                    while task.cancelled and self._pending:
                        task = self._pending.popleft()
                    if task.cancelled:
                        return
                    self._send_task(w, task, k)

    def _send_task(self, w: _Worker, task: Task, k: int) -> None:  # under self._lock
        w.tasks[task.id] = (task, k)
        renew = k in w.renew
        w.renew.discard(k)
        try:
            w.conn.send(("task", task.id, task.seed, task.epoch, task.index, k, renew))
        except (OSError, ValueError):
            pass  # the sentinel reports the death

    def _loop(self) -> None:
        while True:
            try:
                if not self._step():
                    return
            except Exception:  # a bug here must not silently stop every batch of every consumer
                log.exception("worker pool dispatcher error (continuing)")
                time.sleep(0.1)

    def _step(self) -> bool:
        """One round of the dispatcher; False once stopping."""
        with self._lock:
            if self._stopping:
                return False
            workers = list(self._workers)
        self._assign()
        objs = [self._wake_r] + [w.conn for w in workers if w.alive] + \
               [w.process.sentinel for w in workers if w.alive]
        for obj in mp_wait(objs, timeout=0.5):
            if obj == self._wake_r:
                os.read(self._wake_r, 4096)
                continue
            for w in workers:
                if obj is w.conn:
                    self._on_message(w)
                elif obj == w.process.sentinel and w.alive and not w.conn.poll():
                    self._on_death(w)
        return True

    def _on_message(self, w: _Worker) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            self._on_death(w)
            return
        header = pb.BatchHeader.FromString(msg[4]) if msg[0] == "done" else None
        opened = None
        if header is not None and msg[3] is not None:
            # Opened before taking the task off the worker: until then no other task can be
            # given this slot, so the worker cannot replace the region under us.
            try:
                opened = _ServerSlot(*msg[3], worker=w)
            except OSError as exc:
                self._on_unmappable(w, msg[1], exc)
                return
        # One locked step from "the task is done" to "its slot is in use": other threads assign
        # tasks too (submit, release), and must never see the slot free while it holds this batch.
        with self._lock:
            entry = w.tasks.pop(msg[1], None)
            if entry is None:
                if opened is not None:
                    opened.close()
                return  # stale
            task, k = entry
            if header is None:
                self.batch_errors += 1
            else:
                if opened is not None:
                    if w.slots[k] is not None:
                        w.slots[k].close()
                    w.slots[k] = opened
                slot = w.slots[k]
                if slot is None:  # cannot happen unless slot bookkeeping is wrong: drop the batch, ask again
                    log.error("data worker %d built into slot %d, which the server no longer has", w.wid, k)
                    w.renew.add(k)
                    if not task.cancelled:
                        self._pending.appendleft(task)
                    return
                slot.in_use = True
                slot.used_bytes = header.payload_bytes
                self.batches_built += 1
                self.samples_skipped += header.samples_skipped
                self.build_seconds += header.build_s
        if header is None:
            _, _, kind, message, tb, sample = msg
            if not task.cancelled:
                self._fail(task, kind, message, tb, sample)
            return
        if task.cancelled:
            self._release(slot)
            return
        view = memoryview(slot.map)[:header.payload_bytes]
        task.on_result(Result(task, header=header, payload=view, shm_path=slot.path, shm_size=slot.capacity,
                              shm_inode=slot.inode, _release=lambda: self._release(slot),
                              _retire=lambda: self._retire(slot), _lease=lambda: self._lease(slot)))

    def _on_unmappable(self, w: _Worker, task_id: int, exc: OSError) -> None:
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
            w.renew.add(k)  # the worker must report a fresh region for this slot
            if dead and not task.cancelled:
                self._pending.appendleft(task)
        if dead:
            log.warning("data worker %d died before its epoch %d batch %d could be mapped; building it again",
                        w.wid, task.epoch, task.index)
        elif not task.cancelled:
            self._fail(task, pb.INTERNAL,
                       f"data server could not map the batch data worker {w.wid} built ({exc}); "
                       "if it is out of file descriptors, raise the limit (ulimit -n)")

    def _lease(self, slot: _ServerSlot) -> bool:
        with self._lock:
            if slot.leased:
                return True
            if slot.orphan or slot.worker.leased >= self._num_slots - 1:
                return False
            slot.leased = True
            slot.worker.leased += 1
            self.leases += 1
            return True

    def _unlease(self, slot: _ServerSlot) -> None:  # under self._lock
        if slot.leased:
            slot.leased = False
            slot.worker.leased -= 1

    def _release(self, slot: _ServerSlot) -> None:
        with self._lock:
            slot.in_use = False
            self._unlease(slot)
            if slot.orphan:
                slot.close()
        self._assign()

    def _retire(self, slot: _ServerSlot) -> None:
        with self._lock:
            self._unlease(slot)
            w = slot.worker
            for k, s in enumerate(w.slots):
                if s is slot:
                    w.slots[k] = None
                    w.renew.add(k)
            slot.in_use = False
            slot.orphan = True
            slot.close()  # the consumer's own mapping keeps the region alive while it needs it
            self.retired += 1
        self._wake()

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

    def _on_death(self, w: _Worker) -> None:
        with self._lock:
            if not w.alive:
                return
            w.alive = False
            tasks = [t for t, _ in w.tasks.values()]
            w.tasks.clear()
            for s in w.slots:
                if s is not None:
                    s.orphan = True
                    if not s.in_use:  # slots holding built batches close when those are released
                        s.close()
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
            # Replace it off the dispatcher thread: a spawn takes seconds.
            threading.Thread(target=self._replace, args=(w,), daemon=True).start()

    def _replace(self, dead: _Worker) -> None:
        try:
            self._try_replace(dead)
        finally:
            with self._lock:
                self._replacing -= 1

    def _try_replace(self, dead: _Worker) -> None:
        for attempt in range(len(RESPAWN_BACKOFF_S) + 1):
            with self._lock:
                if self._stopping:
                    return
            replacement = self._spawn(dead.wid)
            try:
                self._await_ready(replacement, time.monotonic() + self._start_timeout)
                break
            except ConfigError as exc:
                replacement.process.kill()
                replacement.process.join(5)
                if attempt == len(RESPAWN_BACKOFF_S):
                    log.error("could not replace data worker %d after %d attempts: %s", dead.wid, attempt + 1, exc)
                    self.failed_replacements += 1
                    self._check_workers_left(f"{exc} ({attempt + 1} attempts)")
                    return
                log.warning("replacing data worker %d failed (%s); retrying in %.1fs", dead.wid, exc,
                            RESPAWN_BACKOFF_S[attempt])
                time.sleep(RESPAWN_BACKOFF_S[attempt])
        with self._lock:
            if self._stopping:
                replacement.conn.send(("stop",))
                self._workers.append(replacement)  # stop() joins it
                return
            self._workers[self._workers.index(dead)] = replacement
            self.restarts += 1
        self._wake()
