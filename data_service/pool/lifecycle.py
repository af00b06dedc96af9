"""Starting, retrying, replacing and stopping data worker processes.

A worker that dies while the server starts (killed, out of memory) is started again a few
times (``STARTUP_RETRY_S``); one whose pipeline raised is not (it would raise again). A worker
that dies while serving is replaced with back-off (``RESPAWN_BACKOFF_S``), on a thread the pool
starts for it. These functions hold no pool state: they start, wait for and stop processes, and
hand back the handles; the pool records them through its state's events (state.py), and what
becomes of a dead worker's tasks is decided there. The process itself is process.py.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Callable, Protocol, cast

from ..errors import ConfigError
from .messages import FatalMsg, MessageConnection, ReadyMsg, StopMsg, message_connection
from .slots import SlotTable
from .forked import WarmParentGone
from .process import worker_main
from .results import exit_status

if TYPE_CHECKING:
    from ..contract.pipeline import PipelineInfo

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


class WorkerProcess(Protocol):
    """What the pool uses of a worker's process: a ``multiprocessing.Process``, or a
    ``forked.ForkedProcess`` that a warm parent forked (pid and sentinel are None until started)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def sentinel(self) -> int | None: ...
    @property
    def exitcode(self) -> int | None: ...
    def start(self) -> None: ...
    def is_alive(self) -> bool: ...
    def join(self, timeout: float | None = None) -> None: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...


@dataclass
class WorkerHandle:
    """The server's view of one worker process. Once spawned, its task map, slot table and
    flags change in the pool's state's events only (state.py), under the pool's lock."""

    wid: int
    process: WorkerProcess | None  # None until launched (``launch``)
    conn: MessageConnection
    table: SlotTable
    child_end: Connection | None = None  # the worker's end of the pipe, until a process takes it
    tasks: dict = field(default_factory=dict)  # task id -> (Task, slot), in the order sent
    # tasks it reported built into a region not yet opened (decided later): not what it was
    # building should it die meanwhile
    reported: set = field(default_factory=set)
    ready: bool = False
    alive: bool = True


def spawn(ctx, wid: int, cfg: WorkerConfig) -> WorkerHandle:
    """Start worker ``wid`` (it loads the pipeline in the background; see ``await_ready``)."""
    w = unstarted(wid, cfg)
    launch(ctx, w, cfg)
    return w


def unstarted(wid: int, cfg: WorkerConfig) -> WorkerHandle:
    """Worker ``wid``'s handle and pipe, with no process yet: the pool records it at once and
    ``launch``es it once it knows which context to start it with."""
    parent, child = mp_connection.Pipe(duplex=True)
    return WorkerHandle(wid, None, message_connection(parent), SlotTable(cfg.num_slots), child_end=child)


def launch(ctx, w: WorkerHandle, cfg: WorkerConfig, spawn_if_gone: bool = True) -> None:
    """Start the process of unstarted handle ``w`` with ``ctx``: spawn's context, or a warm parent
    (warm_start.py) that forks it; spawned after all if that parent has died (else, without
    ``spawn_if_gone``, WarmParentGone is raised)."""
    args = (w.child_end, cfg.spec_json, w.wid, cfg.num_slots, cfg.log_level, cfg.compression, cfg.nice)
    name = f"hetero-data-worker-{w.wid}"
    child_end = cast(Connection, w.child_end)  # set by ``unstarted``; only ``launch`` clears it
    w.process = ctx.Process(target=worker_main, name=name, daemon=True, args=args)
    try:
        w.process.start()
    except WarmParentGone as exc:  # ctx.Process gives spawned ones from now on
        if not spawn_if_gone:
            child_end.close()
            raise
        log.warning("data worker %d is spawned, not forked: %s", w.wid, exc)
        w.process = ctx.Process(target=worker_main, name=name, daemon=True, args=args)
        w.process.start()
    child_end.close()
    w.child_end = None


def await_ready(w: WorkerHandle, deadline: float, start_timeout: float) -> ReadyMsg:
    """Wait until ``w`` has loaded the pipeline; returns what it reported (``.info``: its PipelineInfo).

    Raises:
        ConfigError: the pipeline failed to load, or took longer than ``start_timeout``.
        DiedLoading: the process ended without a Python error.
    """
    process = cast(WorkerProcess, w.process)  # launched: ``spawn`` or ``launch`` came first
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
                break
            if isinstance(msg, ReadyMsg):
                return msg
            if isinstance(msg, FatalMsg):
                raise ConfigError(f"data worker could not load the pipeline: {msg.message}\n{msg.traceback}")
            raise ConfigError(f"data worker {w.wid} sent {type(msg).__name__} before it was ready")
        elif not process.is_alive() and not w.conn.poll():
            break
    process.join(1.0)  # its exit status (start-up: not on the data plane's loop)
    raise DiedLoading(f"data worker {w.wid} {exit_status(process.exitcode)} while loading the pipeline")


def start_with_retry(ctx, w: WorkerHandle, deadline: float, cfg: WorkerConfig,
                     on_respawn: Callable[[WorkerHandle], None]) -> ReadyMsg:
    """Wait until worker ``w`` is ready, starting it again if it dies while loading; returns
    what it reported.

    ``on_respawn`` gets each new process before the wait on it, so a caller that gives up
    stops the newest one.
    """
    for attempt, pause in enumerate(STARTUP_RETRY_S + (None,)):
        try:
            return await_ready(w, deadline, cfg.start_timeout)
        except DiedLoading as exc:
            if pause is None:
                raise ConfigError(f"{exc}; gave up after {attempt + 1} attempts (is the node out of memory?)") from None
            log.warning("%s; starting it again in %.1fs", exc, pause)
        cast(WorkerProcess, w.process).join(1.0)  # launched: ``await_ready`` waited on it
        time.sleep(pause)
        w = spawn(ctx, w.wid, cfg)
        on_respawn(w)
        deadline = time.monotonic() + cfg.start_timeout
    raise AssertionError("not reached: the last attempt returns or raises")


def start_all(ctx, handles: list[WorkerHandle], cfg: WorkerConfig, deadline: float,
              on_respawn: Callable[[int, WorkerHandle], None],
              after_first: Callable[[ReadyMsg, list[WorkerHandle]], None] = lambda ready, rest: None) -> PipelineInfo:
    """Wait until every worker of ``handles`` is ready, each started again as ``start_with_retry``
    does (``on_respawn(k, new)``). Those not launched yet are launched by ``after_first``, which
    gets the first worker's report once it is ready, and the others' handles.

    Returns the PipelineInfo they all reported.

    Raises:
        ConfigError: a worker could not load the pipeline, or two built different ones.
    """
    first = start_with_retry(ctx, handles[0], deadline, cfg, lambda new: on_respawn(0, new))
    after_first(first, handles[1:])
    infos = [first.info] + [start_with_retry(ctx, w, deadline, cfg, partial(on_respawn, k)).info
                            for k, w in enumerate(handles[1:], start=1)]
    if any(i != infos[0] for i in infos):
        raise ConfigError(f"the data workers built different pipelines from one spec ({infos}); the builder "
                          "must depend on its options only (not on the process, the time or a changing folder)")
    return cast("PipelineInfo", infos[0])  # what every worker reports (process.py)


def spawn_replacement(ctx, wid: int, cfg: WorkerConfig, stopping: Callable[[], bool],
                      take_spare: Callable[[int], WorkerHandle | None] = lambda wid: None) -> WorkerHandle | None:
    """Start a replacement for dead worker ``wid``, retrying with back-off; a ready spare
    (``take_spare``, spare.py) takes its place at once where there is one.

    Returns the ready worker; None when stopping.

    Raises:
        ConfigError: every attempt failed (the message has the last reason and the count).
    """
    for attempt in range(len(RESPAWN_BACKOFF_S) + 1):
        if stopping():
            return None
        spare = take_spare(wid) if attempt == 0 else None
        if spare is not None:
            pid = cast(WorkerProcess, spare.process).pid  # a ready spare was launched
            log.info("data worker %d is replaced by the spare (pid %s)", wid, pid)
            return spare
        replacement = spawn(ctx, wid, cfg)
        try:
            await_ready(replacement, time.monotonic() + cfg.start_timeout, cfg.start_timeout)
            return replacement
        except ConfigError as exc:
            process = cast(WorkerProcess, replacement.process)  # ``spawn`` launched it
            process.kill()
            process.join(5)
            if attempt == len(RESPAWN_BACKOFF_S):
                log.error("could not replace data worker %d after %d attempts: %s", wid, attempt + 1, exc)
                raise ConfigError(f"{exc} ({attempt + 1} attempts)") from None
            log.warning("replacing data worker %d failed (%s); retrying in %.1fs", wid, exc,
                        RESPAWN_BACKOFF_S[attempt])
            time.sleep(RESPAWN_BACKOFF_S[attempt])
    return None


def stop_workers(handles: list[WorkerHandle], timeout: float) -> None:
    """Stop worker processes: politely, then SIGKILL after ``timeout``."""
    handles = [w for w in handles if w.process is not None]  # never launched: nothing to stop
    for w in handles:
        with contextlib.suppress(OSError, ValueError):
            w.conn.send(StopMsg())
    deadline = time.monotonic() + timeout
    for w in handles:
        process = cast(WorkerProcess, w.process)  # launched: the others were left out above
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(2.0)


def release(w: WorkerHandle) -> None:
    """Close what the server holds of worker ``w``, which has ended (``stop_workers``): its pipe and
    its process handle's descriptors (its regions are the state's: ``PoolState.workers_ended``). A
    server started and stopped in a long-lived process (a notebook, a test run) leaves nothing open."""
    w.conn.close()
    if w.child_end is not None:  # never launched
        w.child_end.close()
        w.child_end = None
    if w.process is not None:
        with contextlib.suppress(ValueError):  # it could not be killed: its handle closes when collected
            w.process.close()
