"""How a pool starts its data workers: forked from a warm parent, or spawned.

A spawned worker imports torch and the pipeline module itself (seconds of CPU, a few hundred MB
of private memory each). With ``worker_start="warm"`` (the default) each pool starts one warm
parent (warm_parent.py, itself spawned, so no gRPC or thread of the server crosses a fork) that
imports torch and the pipeline's module (whatever that module imports, nothing else), then forks
each worker in milliseconds, sharing those pages copy-on-write; a replacement for a dead worker
is forked by the same parent. Each fork gets the server's environment of that moment, as a
spawned worker would.

The pool falls back to spawn, with a log line saying why, when the pipeline module cannot be
imported in the warm parent, or importing it left a thread running or loaded grpc there (a fork
would copy them half-way); and, for the workers still to start, when the warm parent has died.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import threading
import time
from typing import Callable

from ..errors import ConfigError
from .forked import WarmParent, WarmParentGone

log = logging.getLogger(__name__)

START_METHODS = ("warm", "spawn")
# What every worker imports whatever its pipeline (process.py), without grpc or a thread.
BASE_PRELOAD = ("torch", "data_service.contract.pipeline")


def check_start_method(value: str) -> str:
    if value not in START_METHODS:
        raise ConfigError(f"worker_start={value!r} must be one of {', '.join(START_METHODS)} "
                          "(warm: fork workers from a parent that imported torch and the pipeline module; "
                          "spawn: each worker imports them itself)")
    return value


def pipeline_module(spec_json: str) -> str | None:
    """The module of the spec's ``module:builder`` target (read from the JSON, so as to import
    nothing before the warm parent starts); None for a spec that does not parse (the workers
    then report what is wrong with it, as they load it)."""
    try:
        return json.loads(spec_json)["target"].partition(":")[0] or None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def unclean(report: dict, module: str | None) -> str | None:
    """Why workers must not be forked from the warm parent that sent ``report``; None if they may."""
    if report["error"]:
        return f"pipeline module {module!r} cannot be preloaded: {report['error']}"
    if report["grpc"]:
        return f"importing {module!r} loaded grpc, whose threads and sockets a fork would copy half-way"
    if len(report["threads"]) > 1:
        return (f"importing {module!r} left {len(report['threads'])} threads running ({', '.join(report['threads'])}); "
                "a fork copies only one, with whatever locks the others held")
    return None


class Launcher:
    """Starts a pool's unstarted worker handles (lifecycle.py). With the warm parent on a thread of
    its own: it imports torch before it forks anything, and meanwhile the server's main thread
    imports the builder's module, as it does while spawned workers load."""

    def __init__(self, method: str, cfg, stopping: Callable[[], bool]) -> None:
        self.method = check_start_method(method)  # "spawn" once it fell back
        self.ctx = None     # what the workers start with, once known: a WarmParent or spawn's context
        self.parent: WarmParent | None = None
        self._module: str | None = None
        self._cfg, self._stopping, self._handles, self._deadline = cfg, stopping, [], 0.0
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="worker-launch", daemon=True)

    def start(self, handles: list) -> None:
        """Start the processes of ``handles``: at once with spawn; from a warm parent, started here
        (the earlier, the sooner the first batch), on the thread that waits for it to import."""
        self._handles, self._deadline = handles, time.monotonic() + self._cfg.start_timeout
        if self.method == "spawn":
            self._run()
            return
        self._module = pipeline_module(self._cfg.spec_json)
        self.parent = WarmParent(list(BASE_PRELOAD) + ([self._module] if self._module else []))
        self._thread.start()

    def _run(self) -> None:
        from .lifecycle import launch

        try:
            self.ctx = self._context()
            for w in self._handles:
                if self._stopping():
                    break  # the pool stopped without waiting for this thread: start nothing it will not stop
                launch(self.ctx, w, self._cfg)
        except BaseException as exc:  # wait() raises it on the pool's thread
            self._error = exc

    def _context(self):
        if self.method == "spawn":
            return mp.get_context("spawn")
        module, parent = self._module, self.parent
        if parent is None:
            raise ConfigError("the data workers' warm parent was stopped before they started")
        try:
            report = parent.ready(max(0.0, self._deadline - time.monotonic()))
        except WarmParentGone as exc:
            report, reason = None, str(exc)
        else:
            if report is None:
                raise ConfigError(f"the data workers' warm parent did not import {module!r} within "
                                  f"{self._cfg.start_timeout:.0f}s; raise the start-up timeout")
            reason = unclean(report, module)
        if reason is None:
            return parent
        log.warning("starting data workers with spawn, not from a warm parent: %s", reason)
        self.method = "spawn"
        self.close(5.0)
        return mp.get_context("spawn")

    def wait(self):
        """What the workers were started with (a WarmParent, or spawn's context), once all started.

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
        """Stop the warm parent, if any (after the pool stopped the workers it forked)."""
        with self._lock:
            parent, self.parent = self.parent, None
        if parent is not None:
            parent.close(timeout)
