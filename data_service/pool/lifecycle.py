"""Starting, retrying and replacing data worker processes.

A worker that dies while the server starts (killed, out of memory) is started again a few
times (``STARTUP_RETRY_S``); one whose pipeline raised is not (it would raise again). A worker
that dies while serving is replaced off the dispatcher's thread with back-off
(``RESPAWN_BACKOFF_S``). ``WorkerSet`` holds one pool's processes and does both. Dispatching
tasks to workers, and what becomes of a dead worker's tasks, is workers.py; the process itself
is worker_process.py.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import ConfigError
from .messages import FatalMsg, ReadyMsg, StopMsg, message_connection
from .slots import SlotTable
from .process import worker_main

log = logging.getLogger(__name__)

RESPAWN_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 5.0, 5.0)  # between attempts to replace a dead worker
STARTUP_RETRY_S = (0.5, 1.0, 2.0)  # between start-up attempts of a worker that died while loading


class DiedLoading(ConfigError):
    """A worker process ended before it said ready, without a Python error: killed, out of memory."""


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker of one pool is started with."""

    spec_json: str
    num_slots: int
    start_timeout: float
    log_level: int
    compression: str
    nice: int = 0  # added to each worker's nice value (os.nice) before it loads the pipeline


@dataclass
class WorkerHandle:
    """The server's view of one worker process."""

    wid: int
    process: object  # multiprocessing.Process
    conn: object     # pool_messages.MessageConnection
    table: SlotTable
    tasks: dict = field(default_factory=dict)  # task id -> (Task, slot), in the order sent
    ready: bool = False
    alive: bool = True
    info: object = None  # the PipelineInfo it reported when ready


def spawn(ctx, wid: int, cfg: WorkerConfig) -> WorkerHandle:
    """Start worker ``wid`` (it loads the pipeline in the background; see ``await_ready``)."""
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(
        target=worker_main, name=f"hetero-data-worker-{wid}", daemon=True,
        args=(child, cfg.spec_json, wid, cfg.num_slots, os.getpid(), cfg.log_level, cfg.compression, cfg.nice))
    proc.start()
    child.close()
    return WorkerHandle(wid, proc, message_connection(parent), SlotTable(cfg.num_slots))


def await_ready(w: WorkerHandle, deadline: float, start_timeout: float) -> None:
    """Wait until ``w`` has loaded the pipeline.

    Raises:
        ConfigError: the pipeline failed to load, or took longer than ``start_timeout``.
        DiedLoading: the process ended without a Python error.
    """
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConfigError(
                f"data worker {w.wid} did not load the pipeline within {start_timeout:.0f}s; "
                "raise the start-up timeout or make the pipeline builder faster")
        if w.conn.poll(min(left, 0.5)):
            try:
                msg = w.conn.recv()
            except EOFError:
                w.process.join(1.0)
                raise DiedLoading(f"data worker {w.wid} exited with code {w.process.exitcode} "
                                  "while loading the pipeline") from None
            if isinstance(msg, ReadyMsg):
                w.ready = True
                w.info = msg.info
                return
            if isinstance(msg, FatalMsg):
                raise ConfigError(f"data worker could not load the pipeline: {msg.message}\n{msg.traceback}")
            raise ConfigError(f"data worker {w.wid} sent {type(msg).__name__} before it was ready")
        if not w.process.is_alive() and not w.conn.poll():
            raise DiedLoading(f"data worker {w.wid} exited with code {w.process.exitcode} "
                              "while loading the pipeline")


def start_with_retry(ctx, workers: list[WorkerHandle], k: int, deadline: float, cfg: WorkerConfig,
                     on_restart: Callable[[], None]) -> None:
    """Wait until ``workers[k]`` is ready, starting it again if it dies while loading.

    ``workers[k]`` is replaced in place before each wait, so a caller that gives up stops the
    newest process.
    """
    for attempt, pause in enumerate(STARTUP_RETRY_S + (None,)):
        w = workers[k]
        try:
            await_ready(w, deadline, cfg.start_timeout)
            return
        except DiedLoading as exc:
            if pause is None:
                raise ConfigError(f"{exc}; gave up after {attempt + 1} attempts (is the node out of memory?)") from None
            log.warning("%s; starting it again in %.1fs", exc, pause)
        w.process.join(1.0)
        time.sleep(pause)
        workers[k] = spawn(ctx, w.wid, cfg)
        on_restart()
        deadline = time.monotonic() + cfg.start_timeout


def spawn_replacement(ctx, wid: int, cfg: WorkerConfig, stopping: Callable[[], bool]) -> WorkerHandle | None:
    """Start a replacement for dead worker ``wid``, retrying with back-off.

    Returns the ready worker; None when stopping.

    Raises:
        ConfigError: every attempt failed (the message has the last reason and the count).
    """
    for attempt in range(len(RESPAWN_BACKOFF_S) + 1):
        if stopping():
            return None
        replacement = spawn(ctx, wid, cfg)
        try:
            await_ready(replacement, time.monotonic() + cfg.start_timeout, cfg.start_timeout)
            return replacement
        except ConfigError as exc:
            replacement.process.kill()
            replacement.process.join(5)
            if attempt == len(RESPAWN_BACKOFF_S):
                log.error("could not replace data worker %d after %d attempts: %s", wid, attempt + 1, exc)
                raise ConfigError(f"{exc} ({attempt + 1} attempts)") from None
            log.warning("replacing data worker %d failed (%s); retrying in %.1fs", wid, exc,
                        RESPAWN_BACKOFF_S[attempt])
            time.sleep(RESPAWN_BACKOFF_S[attempt])
    return None


class WorkerSet:
    """One pool's worker processes: started together, each replaced when it dies while serving.

    It shares its pool's lock: ``handles``, ``stopping`` and the counters change under it, and
    the pool reads them under it. Replacing a dead worker takes seconds, so it runs on a thread
    of its own; ``on_gave_up`` is told when a replacement failed for good.
    """

    def __init__(self, cfg: WorkerConfig, num_workers: int, lock: threading.Lock,
                 wake: Callable[[], None]) -> None:
        self.cfg = cfg
        self._num_workers = num_workers
        self._ctx = mp.get_context("spawn")
        self._lock = lock
        self._wake = wake  # wakes the poller: what to poll changed
        self.handles: list[WorkerHandle] = []
        self._spawned_at = 0.0  # when spawn() started them
        self._gone: list[WorkerHandle] = []  # replaced workers whose pipes a poller may still watch
        self.stopping = False
        self.replacing = 0   # replacement threads running
        self.generation = 0  # changes whenever poll_objects() would change
        self.restarts = 0
        self.failed_replacements = 0
        self.on_gave_up: Callable[[str], None] = lambda last_error: None

    def spawn(self) -> None:
        """Start the worker processes, all at once, without waiting for them. Once only."""
        if not self.handles:
            self.handles = [spawn(self._ctx, w, self.cfg) for w in range(self._num_workers)]
            self._spawned_at = time.monotonic()

    def start(self) -> object:
        """Spawn the workers if not yet done and wait until each has loaded the pipeline.

        Returns the PipelineInfo they all reported.

        Raises:
            ConfigError: a worker could not load the pipeline, or two built different ones.
        """
        self.spawn()
        deadline = self._spawned_at + self.cfg.start_timeout  # they load side by side
        for k in range(len(self.handles)):
            start_with_retry(self._ctx, self.handles, k, deadline, self.cfg, self._count_restart)
        infos = [w.info for w in self.handles]
        if any(i != infos[0] for i in infos):
            raise ConfigError(f"the data workers built different pipelines from one spec ({infos}); the builder "
                              "must depend on its options only (not on the process, the time or a changing folder)")
        self.generation += 1
        return infos[0]

    def _count_restart(self) -> None:
        self.restarts += 1

    def stop(self, timeout: float) -> None:
        """Stop every worker process (politely, then SIGKILL after ``timeout``); set ``stopping`` first."""
        for w in self.handles:
            try:
                w.conn.send(StopMsg())
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout
        for w in self.handles:
            w.process.join(max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(2.0)

    def poll_objects(self) -> list:
        """Each live worker's pipe, then each one's process sentinel.

        Also forgets replaced workers: a poller calls this after dropping what it watched before.
        """
        with self._lock:
            self._gone.clear()
            live = [w for w in self.handles if w.alive]
        return [w.conn for w in live] + [w.process.sentinel for w in live]

    def pids(self) -> list[int]:
        return [w.process.pid for w in self.handles if w.alive]

    def died(self, w: WorkerHandle) -> tuple[list, bool] | None:
        """Worker ``w`` died: returns the tasks it had (in the order sent) and whether it is to be
        replaced (``replace_later``); None if its death was already handled."""
        with self._lock:
            if not w.alive:
                return None
            w.alive = False
            self.generation += 1
            tasks = [t for t, _ in w.tasks.values()]
            w.tasks.clear()
            w.table.orphan_all()  # slots holding built batches close when those are released
            stopping = self.stopping
            self.replacing += not stopping  # counted with the death, so no one sees a gap
        return tasks, not stopping

    def replace_later(self, dead: WorkerHandle) -> None:
        """Replace ``dead`` off the polling thread: a spawn takes seconds."""
        threading.Thread(target=self._replace, args=(dead,), name="worker-replace", daemon=True).start()

    def none_left(self) -> bool:
        """No worker is alive and no other one is being replaced (call under the lock, from a
        replacement thread that gave up)."""
        # > 1: the replacement thread calling this still counts itself
        return not (self.stopping or any(w.alive for w in self.handles) or self.replacing > 1)

    def _replace(self, dead: WorkerHandle) -> None:
        try:
            try:
                replacement = spawn_replacement(self._ctx, dead.wid, self.cfg, lambda: self.stopping)
            except ConfigError as exc:
                self.failed_replacements += 1
                self.on_gave_up(str(exc))
                return
            if replacement is None:
                return
            with self._lock:
                if self.stopping:
                    replacement.conn.send(StopMsg())
                    self.handles.append(replacement)  # stop() joins it
                    return
                self.handles[self.handles.index(dead)] = replacement
                self._gone.append(dead)  # its pipe closes once pollers stopped watching it
                self.generation += 1
                self.restarts += 1
            self._wake()
        finally:
            with self._lock:
                self.replacing -= 1
