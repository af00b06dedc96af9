"""What the pool's events leave to do outside the lock, and the ``Result`` each task gets.

The events of ``PoolState`` (state.py) decide under the pool's lock and call nothing; they hand
back these plain values instead, and the worker pool (worker_pool.py, deaths.py) carries them out: a
``Failure`` becomes an error ``Result`` for its task's callback, a built batch becomes a
``Result`` whose bytes are a view of the worker's slot, ``Death`` says what became of a dead
worker and whether to replace it, ``GaveUp`` whether the pool is left without workers.

A built batch's ``Result`` gives its slot back through ``release`` (free again), ``retire`` (a
consumer may still map it) or ``lease`` (a same-host consumer keeps it zero-copy); the pool
turns each into the state's event of that name and then gives the workers more tasks.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Callable

from .messages import DoneMsg
from .slots import ServerSlot
from .tasks import Result, Task
from ..protocol.generated import pb

SHUTTING_DOWN = "data server is shutting down; ask another server"


@dataclass(frozen=True)
class Failure:
    """A task that failed, and what its consumer is told."""

    task: Task
    kind: pb.ErrorKind
    message: str
    traceback: str = ""
    sample_index: int = -1


@dataclass(frozen=True)
class Death:
    """What became of a dead worker's tasks."""

    building: Task | None    # the batch it was building, for the log
    crashed: list[Task]      # a batch that killed too many workers: fails with the exit status
    replace: bool            # start a replacement (the pool is not stopping)


@dataclass(frozen=True)
class GaveUp:
    """A worker's replacement failed for good."""

    failures: list[Failure]  # what waited, now that no worker is left
    no_workers: str          # why no worker is left; "" while one is


def exit_status(code: int | None) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it; None: not known)."""
    if code is None:
        return "ended (its exit status was not known yet)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} ({code})"
    return f"exited with code {code}"


def crashed_too_often(task: Task, exit_code: int | None) -> Failure:
    """``task`` killed ``MAX_ATTEMPTS`` workers (state.py): reported, not retried forever."""
    return Failure(task, pb.INTERNAL,
                   f"{task.attempts} data workers died building this batch (the last {exit_status(exit_code)}); "
                   "the pipeline crashes the process on it (segfault or out of memory?)")


def unmappable(task: Task, wid: int, error: str) -> Failure:
    """The server could not open the region live worker ``wid`` built ``task``'s batch into."""
    return Failure(task, pb.INTERNAL, f"data server could not map the batch data worker {wid} built ({error}); "
                                      "if it is out of file descriptors, raise the limit (ulimit -n)")


def no_workers_left(error: str) -> str:
    """Why every request fails once the last worker could not be replaced (``error``: the last reason)."""
    return f"data server has no data worker left (replacing them failed: {error}); ask another server"


def deliver(failures: list[Failure]) -> None:
    """Hand each failed task its error ``Result`` (outside the pool's lock: the callback is the consumer's)."""
    for failure in failures:
        task = failure.task
        err = pb.BatchError(ref=task.batch.ref(), kind=failure.kind, message=failure.message,
                            traceback=failure.traceback, sample_index=failure.sample_index)
        task.on_result(Result(task, error=err))


def built(task: Task, slot: ServerSlot, msg: DoneMsg, release: Callable[[ServerSlot], None],
          retire: Callable[[ServerSlot], None], lease: Callable[[ServerSlot], bool]) -> Result:
    """The ``Result`` of a batch a worker built into ``slot``: its bytes are a view of the slot,
    and giving it back calls ``release``, ``retire`` or ``lease`` with the slot."""
    view = memoryview(slot.map)[:msg.payload_bytes]
    return Result(task, msg.header, view, shm_path=slot.path, shm_size=slot.capacity, shm_inode=slot.inode,
                  payload_bytes=msg.payload_bytes, raw_bytes=msg.raw_bytes, compress_s=msg.compress_s,
                  _release=lambda: release(slot), _retire=lambda: retire(slot), _lease=lambda: lease(slot))
