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
mid-batch is replaced and its batch rebuilt by another; user-code exceptions travel back with
their traceback and sample index.

``WorkerPool`` is the pool's input and output: it reads and decodes the workers' messages,
sends them tasks, starts and stops their processes (lifecycle.py), has the dead ones reported
and replaced (deaths.py) and hands tasks their results. Every decision, and all the state it
rests on, is ``PoolState``'s (state.py): the pool tells it what happened, one event at a time,
and carries out what the event hands back (results.py). ``Task`` and ``Result`` are tasks.py;
the pipe messages are messages.py.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from multiprocessing.connection import wait as mp_wait
from typing import TYPE_CHECKING, Callable, cast

from ..errors import ConfigError
from .deaths import Deaths
from .lifecycle import WorkerConfig, WorkerHandle, WorkerProcess, release, start_all, stop_workers, unstarted
from .messages import DoneMsg, ErrorMsg, ImportedMsg
from .results import built, deliver
from .slots import ServerSlot
from .state import MAX_ATTEMPTS, TASKS_AHEAD, PoolState
from .tasks import Result, Task
from .warm_start import WorkerStarter

if TYPE_CHECKING:
    from ..contract.pipeline import PipelineInfo

__all__ = ["MAX_ATTEMPTS", "TASKS_AHEAD", "Result", "Task", "WorkerPool"]

log = logging.getLogger(__name__)

# from a region that could not be mapped to deciding its worker is alive (the server is short of
# descriptors) rather than dying (the region went with it)
UNMAPPABLE_WAIT_S = 0.5


class WorkerPool:
    """Runs a pipeline in ``num_workers`` processes; see the module docstring.

    ``state`` is the pool's ``PoolState``; the figures below are its ``counts``.
    """

    def __init__(self, spec_json: str, num_workers: int, slots_per_worker: int = 2,
                 start_timeout: float = 120.0, log_level: int = logging.INFO, compression: str = "", nice: int = 0,
                 worker_start: str = "warm", spare: bool = True) -> None:
        if num_workers < 1:
            raise ConfigError(f"num_workers={num_workers} must be >= 1")
        if slots_per_worker < 1:
            raise ConfigError(f"slots_per_worker={slots_per_worker} must be >= 1")
        self._num_workers = num_workers
        self._cfg = WorkerConfig(spec_json, slots_per_worker, start_timeout, log_level, compression, nice)
        self.starter = WorkerStarter(worker_start, self._cfg, lambda: self.state.stopping, spare)  # method: how they start
        self.state = PoolState(num_workers)
        # Held from deciding a worker's tasks to writing them, so that each worker reads its
        # tasks in the order the state recorded them and two threads' frames never interleave.
        self._send_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._spawned_at = 0.0
        self.info: PipelineInfo | None = None  # the PipelineInfo the workers reported (start())
        # regions a worker reported that could not be mapped, decided later: (worker, task id, error, deadline)
        self._unmapped: list[tuple[WorkerHandle, int, str, float]] = []
        self.on_no_workers: Callable[[str], None] | None = None  # the server turns unhealthy
        self._deaths = Deaths(self.state, self.starter, self._cfg, self._wake,
                              lambda why: None if self.on_no_workers is None else self.on_no_workers(why))
        self._thread: threading.Thread | None = None
        self.started_at = time.monotonic()

    # The state's figures, for the server's stats.
    batches_built = property(lambda self: self.state.counts.batches_built)
    batch_errors = property(lambda self: self.state.counts.batch_errors)
    samples_skipped = property(lambda self: self.state.counts.samples_skipped)
    samples_reread = property(lambda self: self.state.counts.samples_reread)
    build_seconds = property(lambda self: self.state.counts.build_seconds)
    leases = property(lambda self: self.state.counts.leases)
    retired = property(lambda self: self.state.counts.retired)
    restarts = property(lambda self: self.state.counts.restarts)
    generation = property(lambda self: self.state.generation, doc="Changes whenever ``wait_objects()`` would.")
    no_workers = property(lambda self: self.state.no_workers, doc="Why no worker is left (every replacement "
                          "failed); submits then fail at once.")

    # -- lifecycle
    def spawn(self) -> None:
        """Start the worker processes at once, not waiting for them (``start`` waits): they load the
        pipeline while the caller goes on (a server's main process imports the builder's module). Once only."""
        if not self.state.workers():
            self.state.workers_spawned(handles := [unstarted(w, self._cfg) for w in range(self._num_workers)])
            self._spawned_at = time.monotonic()
            self.starter.start(handles)

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
        try:
            self.info = start_all(self.starter.wait(), self.state.workers(), self._cfg,
                                  self._spawned_at + self._cfg.start_timeout, self.state.worker_respawned,
                                  self.starter.after_first)
        except ConfigError:
            self.stop(0)
            raise
        self.state.workers_ready()
        self.starter.keep_spare()
        self.started_at = time.monotonic()
        if own_thread:
            self._thread = threading.Thread(target=self._loop, name="worker-pool", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every worker (politely, then SIGKILL after ``timeout``)."""
        failures = self.state.stop()
        self._wake()
        self.starter.join(max(timeout, 1.0))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(timeout, 1.0))
        stop_workers(self.state.workers(), timeout)
        self.starter.close(max(timeout, 1.0))  # after its workers: it forks no replacement now
        deliver(failures)
        if self._wake_r >= 0 and (self._thread is None or not self._thread.is_alive()):  # nothing polls them now
            for w in self.state.workers_ended():
                release(w)
            wake_r, wake_w, self._wake_r, self._wake_w = self._wake_r, self._wake_w, -1, -1
            os.close(wake_r)
            os.close(wake_w)

    # -- public API
    def submit(self, task: Task) -> Task:
        refused = self.state.submit(task)
        if refused:
            deliver(refused)
        else:
            self._assign()  # on this thread: waking the dispatcher costs more than the send
        return task

    def cancel(self, tasks) -> None:
        self.state.cancel(tasks)

    @property
    def queue_depth(self) -> int:
        return self.state.queue_depth

    def slots_in_use(self) -> tuple[int, int]:
        return self.state.slots_in_use()

    def busy_fraction(self) -> float:
        return min(1.0, self.build_seconds / (max(time.monotonic() - self.started_at, 1e-9) * self._num_workers))

    def worker_pids(self) -> list[int]:
        return self.state.pids()

    # -- polling (the dispatcher thread, or the server's event loop)
    def wait_objects(self) -> list:
        """What to poll: the wake pipe, then each live worker's pipe and process sentinel.

        Also forgets replaced workers: a poller calls this after dropping what it watched before.
        """
        return [self._wake_r] + self.state.poll_objects()

    def handle_ready(self, ready) -> None:
        """Handle objects from ``wait_objects`` that are ready to read."""
        workers = self.state.workers()
        for obj in ready:
            if obj == self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
                continue
            for w in workers:
                if obj is w.conn:
                    while w.alive:  # also the messages the last read took off the pipe with it
                        self._read(w)
                        if not w.conn.pending():
                            break
                # polled, so launched: its process is there
                elif obj == cast(WorkerProcess, w.process).sentinel and w.alive and not w.conn.poll():
                    self._deaths.died(w)
        self.tick()

    def tick(self) -> None:
        """Called now and then by the loop that polls the pool: batches become stuck as time passes."""
        if self._unmapped:
            self._settle_unmappable()
        self._assign()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        while not self.state.stopping:
            try:
                self._assign()
                self.handle_ready(mp_wait(self.wait_objects(), timeout=0.5))
            except Exception:  # a bug here must not silently stop every batch of every consumer
                log.exception("worker pool dispatcher error (continuing)")
                time.sleep(0.1)

    # -- carrying out what the state decided
    def _assign(self) -> None:
        with self._send_lock:
            for w, frames in self.state.assign():
                with contextlib.suppress(OSError, ValueError):  # the sentinel reports the death
                    w.conn.send_frames(frames)

    def _read(self, w: WorkerHandle) -> None:
        """Read and handle one message from worker ``w``'s pipe."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            self._deaths.died(w)
            return
        if isinstance(msg, ErrorMsg):
            deliver(self.state.batch_failed(w, msg))
            return
        if isinstance(msg, ImportedMsg):
            self.starter.learn(msg)  # the warm parent imports them too, off this thread
            return
        if not isinstance(msg, DoneMsg):
            log.error("data worker %d sent an unexpected %s", w.wid, type(msg).__name__)
            return
        opened = None
        if msg.new_region is not None:
            # Opened before the state takes the task off the worker: until then no other task
            # can be given this slot, so the worker cannot replace the region under us.
            try:
                opened = ServerSlot(*msg.new_region, table=w.table)
            except OSError as exc:
                self._unmappable(w, msg.task_id, exc)
                return
        done = self.state.batch_built(w, msg, opened)
        if done is not None:
            task, slot = done
            task.on_result(built(task, slot, msg, self._release, self._retire, self.state.lease))

    def _unmappable(self, w: WorkerHandle, task_id: int, exc: OSError) -> None:
        """Usually the worker died right after reporting the region; a worker still alive
        ``UNMAPPABLE_WAIT_S`` later means the server itself is short of something (descriptors).
        Decided on a later pass of the loop (``_settle_unmappable``), never by waiting here: this
        runs on the data plane's event loop."""
        self.state.region_reported(w, task_id)
        self._unmapped.append((w, task_id, str(exc), time.monotonic() + UNMAPPABLE_WAIT_S))

    def _settle_unmappable(self) -> None:
        """Decide the regions that could not be mapped whose worker has died since, or has not."""
        now, waiting = time.monotonic(), []
        for w, task_id, error, deadline in self._unmapped:
            dead = not cast(WorkerProcess, w.process).is_alive()  # it built a batch: launched
            if not dead and now < deadline:
                waiting.append((w, task_id, error, deadline))
                continue
            task, failures = self.state.region_unmappable(w, task_id, dead, error)
            if task is not None and dead:
                log.warning("data worker %d died before its %s could be mapped; building it again", w.wid, task.batch)
            deliver(failures)
        self._unmapped = waiting

    def _release(self, slot: ServerSlot) -> None:
        self.state.release(slot)
        self._assign()

    def _retire(self, slot: ServerSlot) -> None:
        self.state.retire(slot)
        self._assign()
