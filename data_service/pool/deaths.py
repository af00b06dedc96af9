"""What the worker pool does once a data worker has died: the death logged with its exit status,
the batch that killed too many workers failed, a replacement started, a pool left with none told.

The pool's state decides each step (state.py); this carries it out, waiting only on threads of its
own (a replacement takes seconds to start, a broken pipe's exit status comes a moment later): the
thread that reports a death polls the workers, and may be the data plane's event loop.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Callable, cast

from ..errors import ConfigError
from .lifecycle import WorkerConfig, WorkerHandle, WorkerProcess, spawn_replacement
from .messages import StopMsg
from .results import Death, crashed_too_often, deliver, exit_status
from .state import PoolState
from .warm_start import WorkerStarter

log = logging.getLogger(__name__)

EXIT_WAIT_S = 2.0  # from a worker's pipe breaking to its exit status, at most (a killed one: milliseconds)


class Deaths:
    """Carries out the deaths of one pool's workers.

    Args:
        state, starter, cfg: the pool's state, how it starts workers, what they are started with.
        wake: wakes the pool's poller (a replacement changes what it polls).
        no_workers: told why, once the last worker could not be replaced.
    """

    def __init__(self, state: PoolState, starter: WorkerStarter, cfg: WorkerConfig, wake: Callable[[], None],
                 no_workers: Callable[[str], None]) -> None:
        self._state, self._starter, self._cfg, self._wake, self._no_workers = state, starter, cfg, wake, no_workers

    def died(self, w: WorkerHandle) -> None:
        """Worker ``w``'s process ended or its pipe broke (the polling thread; a second report is ignored)."""
        code = cast(WorkerProcess, w.process).exitcode  # polled: launched
        death = self._state.worker_died(w)
        if death is None:
            return
        if death.replace:  # off the polling thread: a spawn takes seconds
            threading.Thread(target=self._replace, args=(w,), name="worker-replace", daemon=True).start()
        if code is None:  # its pipe broke before it was reaped: the status comes a moment later, off this thread
            threading.Thread(target=self._report, args=(w, death), name="worker-death", daemon=True).start()
        else:
            self._report(w, death, code)

    def _report(self, w: WorkerHandle, death: Death, code: int | None = None) -> None:
        """Log how worker ``w`` ended and fail the batch that killed too many workers, once its exit
        status is known (waited for up to ``EXIT_WAIT_S``)."""
        process = cast(WorkerProcess, w.process)  # it died: launched
        if code is None:
            process.join(EXIT_WAIT_S)
            code = process.exitcode
        task = death.building
        log.warning("data worker %d (pid %s) %s%s", w.wid, process.pid, exit_status(code),
                    f" while building {task.batch}" if task else "")
        deliver([crashed_too_often(t, code) for t in death.crashed])

    def _replace(self, dead: WorkerHandle) -> None:
        try:
            new = spawn_replacement(self._starter.ctx, dead.wid, self._cfg, lambda: self._state.stopping,
                                    self._starter.take_spare)
        except ConfigError as exc:
            outcome = self._state.replacement_gave_up(str(exc))
            deliver(outcome.failures)
            if outcome.no_workers:
                self._no_workers(outcome.no_workers)
            return
        except BaseException:
            self._state.worker_replaced(dead, None)  # no longer under way
            raise
        if self._state.worker_replaced(dead, new):
            self._wake()  # what to poll changed
        elif new is not None:
            with contextlib.suppress(OSError, ValueError):
                new.conn.send(StopMsg())
