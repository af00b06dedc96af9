"""A spare data worker: forked from the warm parent and loaded, waiting to take a dead worker's place.

A replacement forked only once a worker died costs the stream its fork, its pipeline build and
its first batch, in a row. The spare has done the first two already: when a worker dies, the
pool gives the spare the dead one's place (``take``), and forks the next spare in the
background (a moment later: the batches the dead worker owed come first). A spare holds no slot and builds nothing while it waits: its cost is the private
memory of a loaded, idle worker (a few MB when forked; docs/benchmarks.md).

A spare started under another environment than the server's now is dropped rather than taken
(each worker gets the server's environment of when it starts serving, as a spawned one would).
Only a pool whose workers fork from a warm parent keeps one: a spawned spare costs a whole
interpreter's memory.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import cast

from .forked import WarmParent
from .lifecycle import WorkerConfig, WorkerHandle, WorkerProcess, await_ready, launch, release, stop_workers, unstarted
from .messages import SPARE_ID, PromoteMsg

log = logging.getLogger(__name__)

REFILL_AFTER_S = 2.0  # after a take, the next spare waits this long: the stream's catch-up gets the CPU first


class Spare:
    """At most one ready spare worker for one pool, refilled in the background after each ``take``."""

    def __init__(self, cfg: WorkerConfig, stopping) -> None:
        self._cfg, self._stopping = cfg, stopping
        self._lock = threading.Lock()
        self._ready: tuple[WorkerHandle, dict] | None = None  # the spare, and the environment it was started with
        self._filling = False
        self._closed = False

    def fill(self, ctx) -> None:
        """Start a spare from ``ctx`` (a warm parent) on a thread of its own, unless one is there or
        coming, or ``ctx`` cannot fork any more."""
        if not isinstance(ctx, WarmParent) or ctx.gone:
            return
        with self._lock:
            if self._closed or self._filling or self._ready is not None:
                return
            self._filling = True
        threading.Thread(target=self._fill, args=(ctx,), name="spare-worker", daemon=True).start()

    def _fill(self, ctx) -> None:
        handle = None
        try:
            env = dict(os.environ)
            handle = unstarted(SPARE_ID, self._cfg)
            launch(ctx, handle, self._cfg, spawn_if_gone=False)  # a spawned spare is not worth its memory
            await_ready(handle, time.monotonic() + self._cfg.start_timeout, self._cfg.start_timeout)
        except Exception as exc:  # the pool's own workers will say why, if it matters
            log.info("no spare data worker: %s", exc)
            if handle is not None and handle.process is not None and handle.process.pid is not None:
                stop_workers([handle], 1.0)
            handle = None
        with self._lock:
            self._filling = False
            keep = handle is not None and not self._closed and not self._stopping()
            if keep:
                self._ready = (cast(WorkerHandle, handle), env)  # kept: there is one
        if handle is not None and not keep:
            stop_workers([handle], 1.0)

    @property
    def pid(self) -> int | None:
        """The ready spare's pid; None while there is none."""
        ready = self._ready
        return cast(WorkerProcess, ready[0].process).pid if ready is not None else None  # launched: ready

    def take(self, wid: int, ctx) -> WorkerHandle | None:
        """The spare, ready, as worker ``wid`` (a new one is started meanwhile); None when there is
        none, it died, or it was started under an environment that has changed since."""
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is None:
            return None
        handle, env = ready
        usable = cast(WorkerProcess, handle.process).is_alive() and env == dict(os.environ)  # launched: ready
        if usable:
            try:
                handle.conn.send(PromoteMsg(wid))
            except (OSError, ValueError):
                usable = False
        if not usable:
            stop_workers([handle], 1.0)
            self.fill(ctx)
            return None
        handle.wid = wid
        refill = threading.Timer(REFILL_AFTER_S, self.fill, (ctx,))
        refill.daemon = True
        refill.start()
        return handle

    def close(self, timeout: float) -> None:
        """Stop the spare, if any; none is started after this."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, None
        if ready is not None:
            stop_workers([ready[0]], timeout)
            release(ready[0])
