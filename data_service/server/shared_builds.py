"""Batches built once for every job that asks: the batch window between the sessions and the pool.

With a batch window (``ServerOptions.batch_window_bytes`` > 0) the data plane hands each
requested batch to ``SharedBuilds.submit`` instead of the worker pool:

* held by the window (batch_window.py): it is sent from there (a hit); no worker builds it;
* being built for another request: the request waits for that build (joined): a wait of one
  build, never of another job's progress;
* else a worker builds it (a miss); once built, a copy goes into the window, the worker's slot
  goes back, and every request that waits for it gets it.

Once the last batches of an epoch have been asked for, workers with nothing to build build the
next epoch's first batches into the window before any job asks (build_ahead.py).

A job that falls behind the window finds its batches gone and they are built again: exactly the
same bytes, since a batch is a pure function of (pipeline, seed, epoch, index). Nothing is
skipped, and no job waits for another to move. Sent from the window, a batch travels as TCP
bytes even to a consumer on this host (the window is this process's memory, not a worker's
slot). A batch the window cannot take (larger than its budget, or its budget pinned by sends
under way) goes to every request that waits for it from the worker's slot, released after the
last send.

Thread safety: sessions submit and cancel on the data plane's loop; the pool reports builds on
its poller (the same loop) or, while stopping, on another thread; a sent batch is released on
the loop. One lock guards the window and the builds in flight; callbacks run outside it.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable

from ..pool.tasks import Result, Task
from .batch_window import BatchKey, BatchWindow, Entry
from .build_ahead import AheadPlan
from .build_record import BuildRecord
from .stats import WindowFigures

AHEAD_REMEMBERED = 4096  # batches built ahead and not yet asked for, remembered for ``ahead_used``

if TYPE_CHECKING:
    from ..contract.batch_id import BatchId
    from ..contract.wire import WireEncoding


@dataclass(frozen=True)
class BatchIdentity:
    """What every batch of this server shares in its ``BatchKey``: the pipeline's fingerprint and
    how its batches are encoded and compressed."""

    fingerprint: str
    wire_encoding: WireEncoding
    compression: str

    def key(self, batch: BatchId) -> BatchKey:
        """The key of ``batch`` as this server builds it."""
        return BatchKey(self.fingerprint, self.wire_encoding, self.compression, batch)


class _Build:
    """One batch being built (its pool task reports to ``on_built`` with this build), and the requests
    waiting for it; ``ahead``: started before any job asked (build_ahead.py), kept in the window though
    nobody waits."""

    def __init__(self, key: BatchKey, on_built: Callable[["_Build", Result], None], owner: object = None,
                 ahead: bool = False) -> None:
        self.key = key
        self.task = Task(key.batch, partial(on_built, self), owner=owner)
        self.waiters: list[Task] = []
        self.ahead = ahead


@dataclass
class WindowCounts:
    """The window's running counts (``SharedBuilds.figures`` reports them as a ``WindowFigures``)."""

    misses: int = 0          # requests that started a build
    hits: int = 0            # requests sent from the window
    joined: int = 0          # requests that waited for a build another request started
    built: int = 0           # builds finished
    built_again: int = 0     # builds of a batch this server had built before
    unwindowed: int = 0      # builds sent from their slot: the window could not take them
    ahead: int = 0           # builds started before any job asked (build_ahead.py)
    ahead_used: int = 0      # requests answered by a batch built ahead (the first request of each)


class SharedBuilds:
    """The window between the data plane and the worker pool; see the module docstring.

    Args:
        pool: what builds batches (``submit``, ``cancel``: the worker pool).
        window: the batch window.
        identity: the server's part of every ``BatchKey``.
        num_batches: batches per epoch (for the record of what was built).
        workers: the pool's worker processes: batches are built ahead only while fewer builds
            than this are in flight.
        lead: batches of the next epoch built ahead (build_ahead.py; 0: none).
    """

    def __init__(self, pool, window: BatchWindow, identity: BatchIdentity, num_batches: int, workers: int = 1,
                 lead: int = 0) -> None:
        self._pool = pool
        self.window = window
        self.identity = identity
        self.counts = WindowCounts()
        self._record = BuildRecord(num_batches)
        self._lock = threading.Lock()
        self._building: dict[BatchKey, _Build] = {}
        self._waiting: dict[int, _Build] = {}  # id(request) -> the build it waits for
        self._workers = max(1, workers)
        self._ahead = AheadPlan(num_batches, lead)
        self._ahead_unasked: collections.OrderedDict[BatchKey, None] = collections.OrderedDict()  # built ahead, not asked

    # -- what the data plane asks (the loop's thread)
    def submit(self, task: Task) -> None:
        """Answer ``task`` from the window, from a build in flight, or from a new build."""
        key = self.identity.key(task.batch)
        start = None
        with self._lock:
            self._ahead.asked(task.batch)
            if key in self._ahead_unasked:
                del self._ahead_unasked[key]
                self.counts.ahead_used += 1
            entry = self.window.get(key)
            if entry is not None:
                self.counts.hits += 1
            else:
                build = self._building.get(key)
                if build is not None:
                    self.counts.joined += 1
                else:
                    self.counts.misses += 1
                    build = self._building[key] = _Build(key, self._built, owner=task.owner)
                    start = build.task
                build.waiters.append(task)
                self._waiting[id(task)] = build
            ahead = self._start_ahead()
        if entry is not None:
            task.on_result(self._from_entry(task, entry))
        elif start is not None:
            self._pool.submit(start)  # outside the lock: a refusal answers at once, on this thread
        for t in ahead:
            self._pool.submit(t)

    def _start_ahead(self) -> list[Task]:
        """Under the lock: builds of the next epoch's first batches to start now, one per worker
        with nothing to build (build_ahead.py); the caller submits them outside the lock."""
        starts: list[Task] = []
        for batch in self._ahead.due():
            if len(self._building) >= self._workers:
                break
            self._ahead.started(batch)
            key = self.identity.key(batch)
            if key in self.window or key in self._building:
                continue
            build = self._building[key] = _Build(key, self._built, ahead=True)
            self.counts.ahead += 1
            self._ahead_unasked[key] = None
            while len(self._ahead_unasked) > AHEAD_REMEMBERED:
                self._ahead_unasked.popitem(last=False)
            starts.append(build.task)
        return starts

    def cancel(self, tasks: list[Task]) -> None:
        """Requests whose connection ended: they wait no more; a build nobody waits for is cancelled."""
        idle = []
        with self._lock:
            for task in tasks:
                build = self._waiting.pop(id(task), None)
                if build is None:
                    continue
                build.waiters = [w for w in build.waiters if w is not task]
                if not build.waiters and not build.ahead and self._building.get(build.key) is build:
                    del self._building[build.key]
                    idle.append(build.task)
        if idle:
            self._pool.cancel(idle)

    # -- the pool's report (its poller's thread)
    def _built(self, build: _Build, result: Result) -> None:
        with self._lock:
            if self._building.get(build.key) is build:
                del self._building[build.key]
            waiters = build.waiters
            for w in waiters:
                self._waiting.pop(id(w), None)
            entry = None
            if result.error is None:
                self.counts.built += 1
                if self._record.built(build.key.batch):
                    self.counts.built_again += 1
                if waiters or build.ahead:
                    entry = self.window.put(build.key, result.header_bytes, result.payload or b"", result.raw_bytes)
                    if entry is not None and waiters:
                        self.window.pin(entry, len(waiters) - 1)  # one pin per send; put pinned the first
                    elif entry is not None:
                        self.window.unpin(entry)  # built ahead: held for the requests to come
                    elif waiters:
                        self.counts.unwindowed += 1
            ahead = self._start_ahead()  # a worker is free
        for t in ahead:
            self._pool.submit(t)
        if result.error is not None:
            for w in waiters:
                w.on_result(Result(task=w, error=result.error))
            return
        if not waiters:
            result.release()  # built ahead, or cancelled while it was being delivered to us
            return
        if entry is not None:
            result.release()  # the window holds a copy: the worker's slot goes back now
            for w in waiters:
                w.on_result(self._from_entry(w, entry))
            return
        for w, share in zip(waiters, _share(result, waiters)):
            w.on_result(share)

    def _from_entry(self, task: Task, entry: Entry) -> Result:
        """A result for ``task`` sent from the window's copy (pinned until it is released)."""
        def unpin() -> None:
            with self._lock:
                self.window.unpin(entry)

        return Result(task=task, header_bytes=entry.header, payload=memoryview(entry.data),
                      payload_bytes=len(entry.data), raw_bytes=entry.raw_bytes, _release=unpin, _retire=unpin)

    def figures(self) -> WindowFigures:
        """The window's counters and bytes now (for the server's stats)."""
        c, w = self.counts, self.window
        return WindowFigures(hits=c.hits, joined=c.joined, misses=c.misses, built_again=c.built_again,
                             unwindowed=c.unwindowed, built_ahead=c.ahead, ahead_used=c.ahead_used,
                             evicted=w.evicted, held_bytes=w.held_bytes, batches=len(w), budget_bytes=w.budget)

    def close(self) -> None:
        """Drop the window's batches (the server stops); those being sent go with their last send."""
        with self._lock:
            self.window.clear()


def _share(result: Result, waiters: list[Task]) -> list[Result]:
    """``result`` for each of ``waiters``: the slot released (or retired, if any of them was)
    after the last of them. One request takes ``result`` itself (zero copy, a lease as usual)."""
    n = len(waiters)
    if n == 1:
        result.task = waiters[0]
        return [result]
    left = [n]
    retired = [False]

    def end(retire: bool) -> None:
        retired[0] |= retire
        left[0] -= 1
        if left[0] == 0:
            result.retire() if retired[0] else result.release()

    return [Result(task=w, header_bytes=result.header_bytes, payload=memoryview(result.payload)
                   if result.payload is not None else None, shm_path=result.shm_path, shm_size=result.shm_size,
                   shm_inode=result.shm_inode, payload_bytes=result.payload_bytes, raw_bytes=result.raw_bytes,
                   compress_s=result.compress_s if k == 0 else 0.0,
                   _release=lambda: end(False), _retire=lambda: end(True))
            for k, w in enumerate(waiters)]
