"""Starting, retrying and replacing data worker processes.

A worker that dies while the server starts (killed, out of memory) is started again a few
times (``STARTUP_RETRY_S``); one whose pipeline raised is not (it would raise again). A worker
that dies while serving is replaced off the dispatcher's thread with back-off
(``RESPAWN_BACKOFF_S``). Dispatching tasks to workers is workers.py; the process itself is
worker_process.py.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from .errors import ConfigError
from .pool_messages import FatalMsg, ReadyMsg, message_connection
from .slots import SlotTable
from .worker_process import worker_main

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
    codec: str
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
        args=(child, cfg.spec_json, wid, cfg.num_slots, os.getpid(), cfg.log_level, cfg.codec, cfg.nice))
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
