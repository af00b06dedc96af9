"""Fetch a list of batches from many servers, each exactly once, in order.

The consumer decides which batches it needs; servers only build what they are asked for. The
``Fetcher`` is the loop that joins four units, each with one job:

* ``server_set.ServerSet``: which servers there are (a fixed list and a registry), connecting
  and handshaking, dropping, and every connection's frames (one selector, read on the iterating
  thread: no receive thread, no event queue);
* ``scheduler.Scheduler``: what to ask of whom (shares that follow each server's measured speed,
  windows, block affinity and hints, hedges, requeues), with no I/O;
* ``in_order.InOrderBuffer``: batches handed out in the order of the list;
* ``fetch_options.FetchOptions``: the options they share.

Each turn hands out what is ready, takes in servers that connected, joined or left, drops a
server that holds requests without delivering for ``batch_timeout`` (its batches go to the
others), sends the scheduler's requests, and waits for frames. Every consumer yields exactly its
own list, so servers coming and going never lose or repeat a batch; they only change who builds
it. Iteration fails in two ways only, each naming what it saw: no server usable for
``connect_timeout`` seconds (``ServerUnavailableError``, every server and its last error), or one
batch failing ``batch_attempts`` attempts in a row (``BatchFailedError``: ``attempts.py``), so no
fault makes it ask again forever.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, Iterator, Sequence, cast

from data_service.contract.batch_id import BatchId
from data_service.errors import BatchBuildError, DataServiceError, ProtocolError
from data_service.protocol.generated import pb

from .affinity import Affinity
from .attempts import Attempts, Failure
from ..transport.connection import CorruptPayload, Event
from .fetch_options import FetchOptions
from .in_order import InOrderBuffer
from .registry_watch import RegistryWatcher
from .scheduler import Scheduler
from .server_set import Server, ServerSet

log = logging.getLogger(__name__)

TURN_S = 0.2  # the longest the loop waits for frames before it looks at the clock and the registry again


class Fetcher:
    """Iterate ``(batch id, batch)`` for ``batches`` in order; see the module docstring.

    Args:
        servers: ``host:port`` gRPC addresses of the data servers (may be empty with a registry).
        batches: the batches to fetch, in the order to yield them (unique): a list, or a
            ``batch_list.BatchList`` (computed per batch: an epoch of millions costs nothing to list).
        options: the job token, windows, deadlines, TLS (``FetchOptions``).
        affinity: ask each batch of the server owning its shuffle block (``scheduler``).
        registry: a ``RegistryWatcher``: servers that join and leave while the list is fetched.
        keep_open: leave the connections open after a complete iteration, for ``reuse`` (``linger``
            closes them if no later Fetcher takes them over).
        reuse: an earlier Fetcher (same servers) that completed with ``keep_open``: its
            connections, and what it measured of each server's speed, are taken over (the next
            epoch of a persistent loader worker).
    """

    def __init__(self, servers: list[str], batches: Sequence[BatchId], options: FetchOptions, *,
                 affinity: Affinity | None = None, registry: RegistryWatcher | None = None,
                 keep_open: bool = False, reuse: "Fetcher | None" = None) -> None:
        self.options = options
        self._set = ServerSet(list(servers), options, registry)
        # a Fetcher dropped with its connections kept (a dataset iterated once and let go) closes
        # them at once, not when its linger ends
        weakref.finalize(self, self._set.close)
        self._scheduler = Scheduler(batches, options.small_window, affinity)
        self._attempts = Attempts(options.batch_attempts)
        self._keep_open = keep_open
        self._open = False  # connections left open by a complete iteration (keep_open)
        self._handover = threading.Lock()  # taking the open connections over, or closing them at the linger's end
        self.most_held = 0  # the most batches held at once while waiting for an earlier one
        if reuse is not None:
            with reuse._handover:
                if reuse._open and self._set.take_over(reuse._set):
                    # Late frames of the earlier iteration are dropped: none of its batches is owed here.
                    reuse._open = False
                    for address, lane in reuse._scheduler.lanes.items():
                        self._scheduler.lanes.lane(address, lane.base_window, lane.weight).gap = lane.gap

    @property
    def hedges(self) -> int:
        """Batches also asked of a second server."""
        return self._scheduler.hedges

    @property
    def failovers(self) -> int:
        """Servers dropped while they owed batches."""
        return self._scheduler.failovers

    @property
    def servers(self) -> list[Server]:
        """The servers as this Fetcher knows them (connection, registry state, last error)."""
        return list(self._set.servers)

    def stats(self) -> dict[str, int]:
        """Batches each server delivered to this Fetcher."""
        return {a: lane.delivered for a, lane in self._scheduler.lanes.items()}

    def windows(self) -> dict[str, int]:
        """Each connected server's window now (wider while batches are small)."""
        return {a: lane.window for a, lane in self._scheduler.lanes.items()}

    def __iter__(self) -> Iterator[tuple[BatchId, Any]]:
        sched, servers = self._scheduler, self._set
        out = InOrderBuffer(len(sched.batches))
        if servers.registry is not None:
            servers.sync_registry(False, sched.lanes.owes)
            servers.joined_now()
        for s in servers.servers:  # connections taken over from an earlier Fetcher
            if s.conn is not None:
                self._admit(s)
        no_server_since: float | None = None
        complete = False
        try:
            while True:
                for position, batch in out.ready():
                    yield sched.batches[position], batch
                if out.finished:
                    break
                now = time.monotonic()
                if servers.registry is not None:
                    for address in servers.sync_registry(True, sched.lanes.owes):
                        sched.lanes.pop(address, None)  # gone for good, owing nothing
                for s in servers.connect(now):
                    self._admit(s)
                for address in sched.lanes.stalled(now, self.options.batch_timeout):
                    self._drop(address, f"no batch for {self.options.batch_timeout:g}s (batch_timeout)", stalled=True)
                owners = servers.owners()
                orders = sched.plan(out.next, servers.usable(), owners, now, servers.hears_hints(owners))
                for address, batches in orders.fetch.items():
                    error = servers.send(address, batches)
                    if error:
                        self._drop(address, error)
                for address, batches in orders.hint.items():
                    servers.send(address, batches, hint=True)
                usable = any(s.conn is not None and (not s.draining or sched.lanes.owes(s.address))
                             for s in servers.servers)
                if usable:
                    no_server_since = None
                elif no_server_since is None:
                    no_server_since = now
                elif now - no_server_since > self.options.connect_timeout:
                    raise servers.unavailable(now - no_server_since)
                for s, event in servers.wait(TURN_S if usable else 0.1):
                    self._handle(s, event, out)
                self.most_held = out.most_held
            complete = True
        finally:
            self.most_held = out.most_held
            if complete and self._keep_open:
                self._open = True
            else:
                self.close()

    def close(self) -> None:
        """Close every connection (also those a complete ``keep_open`` iteration left open)."""
        self._open = False
        self._set.close()

    def linger(self, seconds: float) -> None:
        """Close the connections a complete ``keep_open`` iteration left open in ``seconds``, unless a
        later Fetcher has taken them over by then: a job between two epochs keeps them, a job that
        stopped iterating (evaluating, saving, done) lets its data servers see it gone."""
        if self._open:
            timer = threading.Timer(seconds, _close_kept, (weakref.ref(self),))  # not keeping it alive
            timer.daemon = True
            timer.start()

    def close_kept(self) -> None:
        """Close the connections a complete ``keep_open`` iteration left open, unless a later
        Fetcher took them over (safe beside that taking over, on any thread)."""
        with self._handover:
            if self._open:
                self.close()

    def _admit(self, s: Server) -> None:
        """A connected server gets its lane: its window and affinity weight from its Hello."""
        workers = s.hello.workers if s.hello is not None else 0
        self._scheduler.lanes.lane(s.address, self.options.window_for(s.hello), float(max(1, workers)))

    def _drop(self, address: str, reason: str, culprit: BatchId | None = None, exc: BaseException | None = None,
              stalled: bool = False) -> None:
        """Close ``address``'s connection, ask again for what it owed, and count the failed attempts
        (``Scheduler.charged``); raises ``BatchFailedError`` when a batch failed too often."""
        charged = self._scheduler.charged(address, culprit, stalled)
        self._set.drop(address, reason)
        n = self._scheduler.lost(address)
        if n or isinstance(exc, ProtocolError):  # bytes damaged on the way are worth a line even when nothing was owed
            log.warning("data server %s failed (%s); asking others for its %d unfinished batches", address, reason, n)
        for batch in charged:
            if isinstance(exc, CorruptPayload) and batch == exc.batch_id:
                failure = Failure(address, reason, expected=exc.expected, got=exc.got)
            elif stalled:
                failure = Failure(address, f"{reason}: dropped")
            elif batch == culprit:
                failure = Failure(address, f"the connection ended while its bytes arrived ({reason})")
            else:
                failure = Failure(address, f"the connection ended before it came ({reason})")
            self._attempts.failed(batch, failure)

    def _handle(self, s: Server, ev: Event, out: InOrderBuffer) -> None:
        if s.conn is not ev.conn:
            return  # a connection dropped earlier in this turn
        if ev.kind == "down":
            self._drop(s.address, f"{type(ev.exc).__name__}: {ev.exc}", ev.batch_id, ev.exc)
            return
        sched = self._scheduler
        which = cast(BatchId, ev.batch_id)  # a "batch" or "error" event names its batch (BulkConnection)
        if ev.kind == "batch":
            s.failures = 0  # it delivers: its reconnects start from the shortest back-off again
            if sched.arrived(s.address, which, ev.nbytes, time.monotonic()):
                out.put(sched.batches.index_of(which), ev.batch)
            return
        err = cast(pb.BatchError, ev.error)  # set on every "error" event
        attempt = err.kind != pb.SHUTTING_DOWN and sched.owes_needed(s.address, which)
        needed = sched.declined(s.address, which, requeue=err.kind == pb.SHUTTING_DOWN)
        if err.kind == pb.SHUTTING_DOWN:
            # drained even when another server owes this batch: the server takes nothing more
            self._set.drain(s.address, err.message or "shutting down")
            return
        if not needed:
            if attempt:  # a hedged copy failed: an attempt, while the other copy may yet come
                self._attempts.failed(which, Failure(s.address, f"{pb.ErrorKind.Name(err.kind)}: {err.message}"))
            return  # not ours, or a hedged batch whose other copy is still owed (or came)
        if err.kind == pb.TRANSFORM_FAILED:
            raise BatchBuildError(err.message, epoch=which.epoch, index=which.index,
                                  sample_index=err.sample_index, remote_traceback=err.traceback, server=s.address)
        raise DataServiceError(f"server {s.address} could not build {which}: "
                               f"{pb.ErrorKind.Name(err.kind)}: {err.message}")


def _close_kept(ref: "weakref.ref[Fetcher]") -> None:
    fetcher = ref()
    if fetcher is not None:
        fetcher.close_kept()
