"""How a pool starts its data workers: forked from a warm parent, or spawned.

A spawned worker imports torch and the pipeline itself (seconds of CPU, a few hundred MB of
private memory each). With ``worker_start="warm"`` (the default) each pool starts one warm
parent (warm_parent.py: a fresh interpreter, so nothing of the server crosses a fork, and never
the server's ``__main__``) that imports what the workers will import (preload.py), then forks
each worker in milliseconds, sharing those pages copy-on-write; a replacement for a dead worker
is forked by the same parent. Each fork gets the server's environment of that moment, as a
spawned worker would.

The first worker is forked alone. Once it has built the pipeline, the warm parent imports what
it imported doing so (a builder that imports inside its body), then forks the others; what a
worker imports while building its first batch is imported there too, for the replacements.

The pool falls back to spawn, with a log line naming the cause, when the pipeline module cannot
be imported in the warm parent or a module it imports there left a thread, grpc or a socket
behind (a fork would copy them half-way: the line names that module); and, for the workers
still to start, when the warm parent has died.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
from typing import TYPE_CHECKING, Callable, cast

from ..errors import ConfigError
from .forked import WarmParent, WarmParentGone, adopt
from .messages import ImportedMsg, ReadyMsg
from .spare import Spare

if TYPE_CHECKING:
    from .lifecycle import WorkerHandle

log = logging.getLogger(__name__)

START_METHODS = ("warm", "spawn")


def check_start_method(value: str) -> str:
    if value not in START_METHODS:
        raise ConfigError(f"worker_start={value!r} must be one of {', '.join(START_METHODS)} "
                          "(warm: fork workers from a parent that imported torch and the pipeline once; "
                          "spawn: each worker imports them itself)")
    return value


def unclean(report: dict) -> str | None:
    """Why workers must not be forked from the warm parent that sent ``report``; None if they may."""
    return f"the pipeline cannot be preloaded: {report['error']}" if report["error"] else report["unsafe"]


class WorkerStarter:
    """Starts a pool's unstarted worker handles (lifecycle.py). With the warm parent on a thread of
    its own: it imports torch before it forks anything, and meanwhile the server's main thread
    imports the builder's module, as it does while spawned workers load."""

    def __init__(self, method: str, cfg, stopping: Callable[[], bool], spare: bool = True) -> None:
        self.method = check_start_method(method)  # "spawn" once it fell back
        self.ctx = None     # what the workers start with, once known: a WarmParent or spawn's context
        self.parent: WarmParent | None = None
        self._handles: list[WorkerHandle]
        self._cfg, self._stopping, self._handles, self._deadline = cfg, stopping, [], 0.0
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._known: set[str] = set()  # modules the warm parent was asked to import after start-up
        self._spare = Spare(cfg, stopping)
        self._keeps_spare = spare
        self._thread = threading.Thread(target=self._run, name="worker-launch", daemon=True)

    def start(self, handles: list) -> None:
        """Start the processes of ``handles``: all at once with spawn; from a warm parent, started
        here (the earlier, the sooner the first batch), the first one only, on the thread that
        waits for it to import (``after_first`` starts the others)."""
        self._handles, self._deadline = handles, time.monotonic() + self._cfg.start_timeout
        if self.method == "spawn":
            self._run()
            return
        self.parent = adopt(self._cfg.spec_json) or WarmParent(self._cfg.spec_json)
        self._thread.start()

    def _run(self) -> None:
        from .lifecycle import launch

        try:
            self.ctx = self._context()
            for w in self._handles[:1] if self.method == "warm" else self._handles:
                if self._stopping():
                    break  # the pool stopped without waiting for this thread: start nothing it will not stop
                launch(self.ctx, w, self._cfg)
        except BaseException as exc:  # wait() raises it on the pool's thread
            self._error = exc

    def _context(self):
        if self.method == "spawn":
            return mp.get_context("spawn")
        parent = self.parent
        if parent is None:
            raise ConfigError("the data workers' warm parent was stopped before they started")
        reason: str | None
        try:
            report = parent.ready(max(0.0, self._deadline - time.monotonic()))
        except WarmParentGone as exc:
            report, reason = None, str(exc)
        else:
            if report is None:
                raise ConfigError(f"the data workers' warm parent did not import the pipeline within "
                                  f"{self._cfg.start_timeout:.0f}s; raise the start-up timeout")
            reason = unclean(report)
        if reason is None:
            report = cast(dict, report)  # no reason: the warm parent reported
            if report["declared_error"] or report["failed"]:
                log.warning("the data workers' warm parent could not import all the pipeline declares: %s",
                            report["declared_error"] or report["failed"])
            return parent
        if self._stopping():  # the pool stopped (a start-up error) and closed the warm parent: nothing to say
            raise ConfigError("the data workers' pool stopped before they started")
        log.warning("starting data workers with spawn, not from a warm parent: %s", reason)
        self.method = "spawn"
        self.close(5.0)
        return mp.get_context("spawn")

    def after_first(self, ready: ReadyMsg, rest: list) -> None:
        """The first worker is ready: the warm parent imports what it imported while building the
        pipeline, then the others of ``rest`` not started yet are (on the caller's thread)."""
        from .lifecycle import launch

        if self.method == "warm":
            self._learn(ready.imported, ready.hazard, "while building the pipeline")
        for w in rest:
            if w.process is None and not self._stopping():
                launch(self.ctx, w, self._cfg)

    def keep_spare(self) -> None:
        """Keep a loaded spare worker forked from the warm parent from now on (spare.py), for a
        dead worker's place; nothing with spawned workers."""
        if self.method == "warm" and self._keeps_spare:
            self._spare.fill(self.ctx)

    @property
    def spare_pid(self) -> int | None:
        """The pid of the spare worker waiting to replace one; None while there is none."""
        return self._spare.pid

    def take_spare(self, wid: int):
        """The spare worker, ready, as worker ``wid``; None when there is none to take."""
        return self._spare.take(wid, self.ctx) if self.method == "warm" else None

    def learn(self, msg: ImportedMsg) -> None:
        """A worker built its first batch, importing ``msg.names``: the warm parent imports them
        too, for the workers it forks later (on a thread of its own: imports take seconds)."""
        if self.method == "warm" and msg.names:
            threading.Thread(target=self._learn, args=(msg.names, msg.hazard, "while building its first batch"),
                             name="warm-preload", daemon=True).start()

    def _learn(self, names, hazard, when: str) -> None:
        parent = self.parent
        with self._lock:
            names = [n for n in names if n not in self._known]
            self._known.update(names)
        if not names or parent is None or parent.gone:
            return
        if hazard is not None and not hazard.clean:
            log.info("a data worker %s after importing %d modules %s; the warm parent does not import them (name "
                     "them in the pipeline builder's worker_imports to share them)", hazard, len(names), when)
            return
        try:
            report = parent.preload(names, f" (which a data worker imported {when})",
                                    max(self._cfg.start_timeout, 1.0))
        except WarmParentGone as exc:
            log.warning("data workers are spawned from now on, not forked from the warm parent: %s", exc)
            return
        if report["unsafe"]:
            log.warning("data workers are spawned from now on, not forked from the warm parent: %s", report["unsafe"])
        else:
            log.debug("the warm parent imported %d modules a data worker imported %s", report["imported"], when)

    def wait(self):
        """What the workers were started with (a WarmParent, or spawn's context), once those this
        starter starts by itself are (all when spawned; the first when forked).

        Raises:
            ConfigError: the warm parent or a worker did not start within the start-up timeout.
        """
        if self._thread.ident is not None:
            self._thread.join(max(0.0, self._deadline - time.monotonic()))
        if self._thread.is_alive():
            raise ConfigError(f"the data workers did not start within {self._cfg.start_timeout:.0f}s; raise the "
                              "start-up timeout, or start them with worker_start='spawn'")
        if isinstance(self._error, ConfigError):
            raise self._error
        if self._error is not None:
            raise ConfigError(f"could not start the data workers: {self._error}") from self._error
        return self.ctx

    def join(self, timeout: float) -> None:
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def close(self, timeout: float) -> None:
        """Stop the spare and the warm parent, if any (after the pool stopped the workers it forked)."""
        self._spare.close(timeout)
        with self._lock:
            parent, self.parent = self.parent, None
        if parent is not None:
            parent.close(timeout)
