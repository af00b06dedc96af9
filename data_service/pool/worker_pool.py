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

Which waiting task a worker gets next, and moving stuck batches out of a worker's way when
another consumer waits, is task_queue.py; the processes themselves (start, stop, replacement)
are worker_lifecycle.py; what the workers report (batches, errors) and giving a batch's slot
back is worker_results.py. ``Task`` and ``Result`` are tasks.py; the slot bookkeeping is
slots.py; the pipe messages are pool_messages.py.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from multiprocessing.connection import wait as mp_wait
from typing import Callable

from ..errors import ConfigError
from .messages import TaskMsg
from .task_queue import TaskQueue
from .tasks import Result, Task
from .lifecycle import WorkerConfig, WorkerHandle, WorkerSet
from .results import WorkerResults
from ..protocol.generated import pb

log = logging.getLogger(__name__)

TASKS_AHEAD = 2  # tasks a worker holds at once: it starts the next without a round trip to us
MAX_ATTEMPTS = 3  # a batch that kills this many workers is reported, not retried forever


class WorkerPool:
    """Runs a pipeline in ``num_workers`` processes; see the module docstring."""

    def __init__(self, spec_json: str, num_workers: int, slots_per_worker: int = 2,
                 start_timeout: float = 120.0, log_level: int = logging.INFO, compression: str = "", nice: int = 0) -> None:
        if num_workers < 1:
            raise ConfigError(f"num_workers={num_workers} must be >= 1")
        if slots_per_worker < 1:
            raise ConfigError(f"slots_per_worker={slots_per_worker} must be >= 1")
        self._num_workers = num_workers
        self._lock = threading.Lock()
        self._pending = TaskQueue(num_workers)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._workers = WorkerSet(WorkerConfig(spec_json, slots_per_worker, start_timeout, log_level, compression, nice),
                                  num_workers, self._lock, self._wake)
        self._workers.on_gave_up = self._check_workers_left
        self._results = WorkerResults(self._lock, self._pending, self._fail, self._on_death, self._assign)
        self._next_id = 1
        self.info = None  # the PipelineInfo the workers reported (start())
        self.no_workers = ""  # why no worker is left (every replacement failed); submits fail at once
        self.on_no_workers: Callable[[str], None] | None = None  # the server turns unhealthy
        self._thread: threading.Thread | None = None
        self.started_at = time.monotonic()

    # What the workers reported (worker_results.py), for the server's stats.
    batches_built = property(lambda self: self._results.batches_built)
    batch_errors = property(lambda self: self._results.batch_errors)
    samples_skipped = property(lambda self: self._results.samples_skipped)
    build_seconds = property(lambda self: self._results.build_seconds)
    leases = property(lambda self: self._results.leases)  # slots a consumer kept zero-copy
    retired = property(lambda self: self._results.retired)  # slots never written again

    @property
    def generation(self) -> int:
        """Changes whenever ``wait_objects()`` would change."""
        return self._workers.generation

    @property
    def restarts(self) -> int:
        """Workers started again: at start-up after dying while loading, or replaced while serving."""
        return self._workers.restarts

    # -- lifecycle
    def spawn(self) -> None:
        """Start the worker processes, all at once, without waiting for them (``start`` waits): they
        load the pipeline while the caller goes on (a data server's main process imports the
        builder's module meanwhile). Once only."""
        self._workers.spawn()

    def start(self, own_thread: bool = True) -> None:
        """Start the workers; wait until each has loaded the pipeline; ``info`` is then what they
        reported (the plan and finish stage).

        Args:
            own_thread: read the workers' pipes on a dispatcher thread of the pool's own. False:
                the caller's event loop does, through ``wait_objects`` and ``handle_ready``.

        Raises:
            ConfigError: a worker could not load the pipeline (with its traceback).
        """
        try:
            self.info = self._workers.start()
        except ConfigError:
            self.stop(0)
            raise
        self.started_at = time.monotonic()
        if own_thread:
            self._thread = threading.Thread(target=self._loop, name="worker-pool", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every worker (politely, then SIGKILL after ``timeout``)."""
        with self._lock:
            self._workers.stopping = True
            pending = self._pending.drain()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(timeout, 1.0))
        self._workers.stop(timeout)
        for task in pending:
            self._fail(task, pb.SHUTTING_DOWN, "data server is shutting down; ask another server")

    # -- public API
    def submit(self, task: Task) -> Task:
        with self._lock:
            refusal = ("data server is shutting down; ask another server" if self._workers.stopping
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
            return len(self._pending) + sum(len(w.tasks) for w in self._workers.handles)

    def slots_in_use(self) -> tuple[int, int]:
        with self._lock:
            used = [s for w in self._workers.handles for s in w.table.in_use()] + self._pending.detached_slots()
            return len(used), sum(s.used_bytes for s in used)

    def busy_fraction(self) -> float:
        elapsed = max(time.monotonic() - self.started_at, 1e-9)
        return min(1.0, self.build_seconds / (elapsed * self._num_workers))

    def worker_pids(self) -> list[int]:
        return self._workers.pids()

    # -- polling (the dispatcher thread, or the server's event loop)
    def wait_objects(self) -> list:
        """What to poll: the wake pipe, then each live worker's pipe and process sentinel.

        Also forgets replaced workers: a poller calls this after dropping what it watched before.
        """
        return [self._wake_r] + self._workers.poll_objects()

    def handle_ready(self, ready) -> None:
        """Handle objects from ``wait_objects`` that are ready to read."""
        with self._lock:
            workers = list(self._workers.handles)
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
                        self._results.on_message(w)
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
                    if self._workers.stopping:
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
            for w in self._workers.handles:
                frames = b""  # this worker's new tasks, in one write: one wake-up of the worker
                while self._pending and w.alive and w.ready and len(w.tasks) < TASKS_AHEAD:
                    made = self._pending.next_for(w.table)
                    if made is None:
                        break
                    task, (k, renew) = made
                    w.tasks[task.id] = (task, k)
                    frames += w.conn.frame(TaskMsg(task.id, task.seed, task.epoch, task.index, k, renew))
                if frames:
                    try:
                        w.conn.send_frames(frames)
                    except (OSError, ValueError):
                        pass  # the sentinel reports the death

    # -- deaths (the replacements are worker_lifecycle.py's)
    def _check_workers_left(self, last_error: str) -> None:
        """After a replacement failed for good: with no worker alive and none being replaced, fail
        what is queued and every later request (consumers ask other servers) and tell the server."""
        with self._lock:
            if not self._workers.none_left():
                return
            self.no_workers = (f"data server has no data worker left (replacing them failed: {last_error}); "
                               "ask another server")
            pending = self._pending.drain()
        for task in pending:
            if not task.cancelled:
                self._fail(task, pb.SHUTTING_DOWN, self.no_workers)
        if self.on_no_workers is not None:
            self.on_no_workers(self.no_workers)

    def _on_death(self, w: WorkerHandle) -> None:
        died = self._workers.died(w)
        if died is None:
            return
        tasks, replace = died
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
        if replace:
            self._workers.replace_later(w)
