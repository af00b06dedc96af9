"""Fetch a list of batches from many servers, each exactly once, in order.

The consumer decides which batches it needs; servers only build what they
are asked for. Each server gets at most ``window`` outstanding requests, topped
up whenever half a window has completed, so a faster server gets more work and a
new server adds throughput with no reconfiguration. A server that dies or
stalls has its unfinished batches asked of the others; one that comes back (same
address) is used again. Only when no server is usable for ``connect_timeout``
seconds does iteration fail, naming every server and its last error.

Batches are yielded in order, so those that arrive early wait for the one before them. No batch
is asked for more than ``AHEAD_WINDOWS`` x ``window`` x servers places ahead of the one the
consumer waits for, which bounds what it holds. When that bound is what keeps a server idle, the
batch the consumer waits for is also asked of that server (a hedged request: whichever copy
comes first is used, the other dropped when it comes), so a straggling or silently stalled server
slows the consumer down instead of stopping it until ``batch_timeout``. A copy that lost still
counts against its server's window until it comes: a stalled server is given nothing more, and is
still dropped after ``batch_timeout``. At the end of the list, when there is nothing left to ask
for, the awaited batch is hedged once its server has delivered nothing for ``HEDGE_TAIL_S``, or
for ``HEDGE_TAIL_GAPS`` times its usual time between batches if that is longer (a slow pipeline
is not taken for a stalled server).

With an ``Affinity`` (a plan shuffled by blocks, data read as shards), each batch goes to the
server that owns its block (``affinity.py``: the same owner on every consumer and rank), so each
block is read from storage by one node. A server with nothing of its own to build takes batches
of blocks it has already built (it holds them in its cache), never others; a server that fails or
drains loses its blocks to the next-ranked server; and a batch stuck on a quiet owner is hedged
as at the end of the list, but only after ``HEDGE_AFFINITY_S`` (an owner fetching a block is quiet
for a while, and a second server building its batch reads the whole block again), or
``HEDGE_TAIL_GAPS`` of the owner's usual gaps if longer.

With a registry (``registry_watch.RegistryWatcher``), servers join and leave while the list is
fetched: a verified new entry becomes a server that is asked for batches as soon as it is
connected (with affinity it owns blocks from then on: only blocks that rank it first move to it),
and a server whose entry is gone is asked for nothing more, keeps delivering what it owes, and is
then closed; one that vanished (kill -9) fails over as any server does. A registered server that
cannot prove the token on the data plane or reports another pipeline is refused and logged, not
fatal (a fixed server doing that is a configuration error). Every consumer yields exactly its own
list, so servers coming and going never lose or repeat a batch; they only change who builds it.

Small batches (at most ``SMALL_BATCH_BYTES``) cost per batch, not per byte: for them the
window grows to ``small_window``, so every process in the chain finds more than one batch
waiting when it wakes; the memory that costs is at most ``small_window`` x 1 MB per server.

The iterating thread drives every connection itself: one selector over all servers' sockets,
frames read and releases sent on that thread, no receive thread and no event queue. Only
connecting (the Hello call and the data-plane handshake) runs on a short-lived thread per
attempt, so a server that accepts but never answers delays nobody else's batches.
"""
from __future__ import annotations

import collections
import logging
import selectors
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import grpc

from data_service.errors import (BatchBuildError, ConfigError, DataServiceError, PermissionDeniedError,
                                 ServerUnavailableError, VersionMismatchError)
from data_service.version import PROTOCOL_VERSION
from data_service.wire import pb

from .affinity import Affinity
from .registry_watch import RegistryWatcher
from .connection import LOWAT_CHECK_S, BulkConnection, Event
from .control import ControlClient

log = logging.getLogger(__name__)

SMALL_BATCH_BYTES = 1 << 20  # batches up to this size get the wider window (``small_window``)

RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # back-off between reconnects to one server
CONNECT_POLL_S = 0.02  # how often the loop looks for finished connection attempts while any is in flight
AHEAD_WINDOWS = 2  # batches asked for ahead of the awaited one: at most this x window x servers
HEDGE_TAIL_S = 1.0  # nothing left to ask for: a server that delivered nothing for this long is hedged,
HEDGE_TAIL_GAPS = 4  # or for this many of its usual times between batches, if longer
HEDGE_AFFINITY_S = 10.0  # with affinity: a quiet owner may be fetching a block; another server
# building its batch would read the whole block again, so wait this long before hedging
REGISTRY_TURN_S = 0.2  # with a registry, the longest the loop waits for frames before looking at it again
BLOCKS_REMEMBERED = 16  # shuffle blocks a server built lately, taken as still in its cache (affinity)


def _key(ref: pb.BatchRef) -> tuple[int, int, int]:
    return ref.seed, ref.epoch, ref.index


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"server address {address!r} must look like 'host:port'")
    return host.strip("[]"), int(port)


@dataclass
class _Server:
    address: str
    conn: BulkConnection | None = None
    outstanding: dict[tuple[int, int, int], pb.BatchRef] = field(default_factory=dict)
    draining: bool = False
    failures: int = 0
    retry_at: float = 0.0
    last_error: str = "never connected"
    last_progress: float = 0.0
    delivered: int = 0
    last_batch: float = 0.0  # time.monotonic() of its last batch
    gap: float = 0.0         # its usual time between batches (moving average)
    watching: int = 0  # selector events registered for its connection
    connecting: "_Attempt | None" = None  # a connection attempt in flight
    blocks: dict[int, None] = field(default_factory=dict)  # shuffle blocks it built lately (affinity), oldest first
    server_id: str = ""      # from its Hello (or its registry entry)
    registered: bool = False  # came from the registry (not the fixed list)
    late: bool = False        # joined mid-iteration: owns blocks only once connected
    retired: bool = False     # its registry entry is gone: asked for nothing more, closed when it owes nothing
    refused: str = ""         # why it is never used (registered servers only)


class _Attempt:
    """One connection attempt: its thread fills it in, the iterating thread takes it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False
        self.abandoned = False  # the Fetcher closed meanwhile: the attempt's thread closes what it opened
        self.hello: pb.HelloResponse | None = None
        self.conn: BulkConnection | None = None
        self.exc: BaseException | None = None


class Fetcher:
    """Iterate ``(ref, batch)`` for ``refs`` in order; see the module docstring.

    Args:
        servers: ``host:port`` gRPC addresses of the data servers.
        token: the job token.
        refs: the batches to fetch, in the order to yield them (unique).
        window: outstanding requests per server.
        small_window: outstanding requests per server while batches are at most
            ``SMALL_BATCH_BYTES`` (0: always ``window``).
        connect_timeout: seconds to wait while no server is usable.
        batch_timeout: seconds a server may hold requests without delivering any before it
            is treated as failed.
        fingerprint: pipeline fingerprint every server must report ("" = take the first's).
        shared_memory: read batches from shared memory when a server runs on this host.
        tls_ca, tls_server_name: verify TLS servers against this CA bundle (see data_service.tls).
        keep_open: leave the connections open after a complete iteration, for ``reuse``.
        reuse: an earlier Fetcher (same servers) that completed with ``keep_open``: its
            connections are taken over instead of connecting again (the next epoch of a
            persistent loader worker).
        affinity: ask each batch of the server owning its shuffle block (module docstring).
        registry: a ``RegistryWatcher``: servers that join and leave (module docstring); with it
            ``servers`` may be empty.

    Attributes:
        failovers: servers dropped while they owed batches.
        hedges: batches also asked of a second server (module docstring).
        most_held: the most batches held at once while waiting for an earlier one.
    """

    def __init__(self, servers: list[str], token: str, refs: list[pb.BatchRef], *, window: int = 4,
                 small_window: int = 0, connect_timeout: float = 60.0, batch_timeout: float = 300.0,
                 client_id: str = "", fingerprint: str = "", pin_memory: bool = False, max_batch_bytes: int = 1 << 40,
                 client_version: str = PROTOCOL_VERSION, shared_memory: bool = True, tls_ca: str = "",
                 tls_server_name: str = "", keep_open: bool = False, reuse: "Fetcher | None" = None,
                 affinity: "Affinity | None" = None, registry: "RegistryWatcher | None" = None) -> None:
        if not servers and registry is None:
            raise ConfigError("servers=[] : give at least one data server address 'host:port', or a registry")
        if window < 1:
            raise ConfigError(f"window={window} must be >= 1")
        self._servers = [_Server(a) for a in servers]
        self._fixed = list(servers)
        self._registry = registry
        self._registry_version = -1
        self._iterating = False
        for s in self._servers:
            split_address(s.address)
        self._token = token
        self._refs = list(refs)
        if small_window < 0:
            raise ConfigError(f"small_window={small_window} must be >= 0 (0: always window={window})")
        self._base_window = window
        self._small_window = small_window
        self._set_window(window)
        self._connect_timeout = connect_timeout
        self._batch_timeout = batch_timeout
        self._client_id = client_id
        self._fingerprint = fingerprint
        self._pin = pin_memory
        self._max = max_batch_bytes
        self._version = client_version
        self._shm = shared_memory
        self._tls_ca = tls_ca
        self._tls_name = tls_server_name
        self._tls_context = None
        if tls_ca:
            from data_service.tls import client_context

            self._tls_context = client_context(tls_ca)
        self._sel: selectors.BaseSelector | None = None
        self._affinity = affinity
        self.failovers = 0
        self.hedges = 0
        self.most_held = 0
        self._hedged: set[tuple[int, int, int]] = set()  # asked of two servers, neither copy here yet
        self._lost: set[tuple[int, int, int]] = set()    # came from one server, still outstanding at the other
        self._keep_open = keep_open
        self._open = False  # connections left open by a complete iteration (keep_open)
        if (reuse is not None and reuse._open and reuse._fixed == self._fixed and reuse._registry is registry
                and all(s.address in self._fixed or s.registered for s in reuse._servers)):
            # Late frames of the earlier iteration are dropped by _handle: none of its refs is outstanding.
            self._servers, self._sel, self._fingerprint = reuse._servers, reuse._sel, reuse._fingerprint
            self._registry_version = reuse._registry_version
            for s in self._servers:  # copies still to come of hedged batches the earlier one used:
                for key in reuse._lost:  # dropped as not ours when they come
                    s.outstanding.pop(key, None)
            reuse._open, reuse._servers, reuse._sel = False, [], None  # they are this Fetcher's now

    def _set_window(self, window: int) -> None:
        self._window = window
        # Requests go out in groups of half a window: one FetchRequest frame, one read and one
        # wake-up of the server per group instead of per batch; half the window stays queued.
        self._refill = max(1, window // 2)

    @property
    def window(self) -> int:
        """Outstanding requests per server now (``small_window`` while batches are small)."""
        return self._window

    # -- connections
    def _start_connect(self, s: _Server) -> None:
        """Connect to ``s`` on a short-lived thread of its own: a server that accepts but never
        answers (a hung process) must not stall the loop that serves the other servers."""
        attempt = s.connecting = _Attempt()
        threading.Thread(target=self._attempt, args=(s.address, attempt), name=f"connect {s.address}",
                         daemon=True).start()

    def _attempt(self, address: str, attempt: "_Attempt") -> None:
        hello = conn = exc = None
        try:
            hello, conn = self._handshake(address)
        except BaseException as e:  # handed to the iterating thread, which raises or retries
            exc = e
        with attempt.lock:
            attempt.hello, attempt.conn, attempt.exc, attempt.done = hello, conn, exc, True
            abandoned = attempt.abandoned
        if abandoned and conn is not None:
            conn.close()

    def _handshake(self, address: str) -> tuple[pb.HelloResponse, BulkConnection]:
        """The control-plane Hello, then the data-plane connection (runs on the attempt's thread)."""
        host, _ = split_address(address)
        with ControlClient(address, self._token, self._client_id, self._version, self._tls_ca,
                           self._tls_name) as ctl:
            hello = ctl.hello(timeout=2.0)
        if hello.shutting_down:
            raise ConnectionError("server is shutting down")
        if hello.bulk_tls and self._tls_context is None:
            raise ConfigError(f"server {address} serves TLS; pass tls_ca= (the CA bundle that signed its certificate)")
        # Never allocate more than the server said its batches can be, whatever a header claims.
        limit = min(self._max, hello.dataset.max_batch_bytes or self._max)
        conn = BulkConnection(address, host, hello.bulk_port, self._token, self._client_id,
                              limit, self._pin, self._version, self._shm and not hello.bulk_tls,
                              self._tls_context if hello.bulk_tls else None, self._tls_name)
        conn.open(timeout=5.0)
        return hello, conn

    def _finish_connect(self, s: _Server, now: float) -> None:
        """Take the finished attempt's connection into the loop, or note why it failed."""
        attempt, s.connecting = s.connecting, None
        exc = attempt.exc
        if isinstance(exc, (PermissionDeniedError, VersionMismatchError, ConfigError)):
            if s.registered:  # a registry entry is not the user's configuration: refuse it, go on
                self._refuse(s, str(exc))
                return
            raise exc  # refused for good: retrying cannot help
        if isinstance(exc, (grpc.RpcError, OSError, DataServiceError)):
            self._failed(s, getattr(exc, "details", lambda: None)() or f"{type(exc).__name__}: {exc}", now)
            return
        if exc is not None:
            raise exc
        conn, fp = attempt.conn, attempt.hello.dataset.fingerprint
        if self._fingerprint and fp != self._fingerprint:
            conn.close()
            if s.registered:
                self._refuse(s, f"it runs pipeline {attempt.hello.dataset.pipeline!r} with fingerprint {fp}, "
                                f"the job runs {self._fingerprint}")
                return
            raise ConfigError(
                f"server {s.address} runs pipeline {attempt.hello.dataset.pipeline!r} with fingerprint {fp}, "
                f"others run {self._fingerprint}: start every data server with the same pipeline and options")
        self._fingerprint = fp
        twin = next((o for o in self._servers if o is not s and o.conn is not None and attempt.hello.server_id
                     and o.server_id == attempt.hello.server_id and (s.registered or o.registered)), None)
        if twin is not None:  # one server under a fixed and a registered address: use it once
            if s.registered or not twin.registered:
                conn.close()
                self._refuse(s, f"it is the same server as {twin.address}", quiet=True)
                return
            self._refuse(twin, f"it is the same server as {s.address}", quiet=True)
        s.server_id = attempt.hello.server_id or s.server_id
        try:
            self._sel.register(conn, selectors.EVENT_READ, conn)
        except (OSError, ValueError, KeyError) as exc:
            conn.close()
            self._failed(s, f"{type(exc).__name__}: {exc}", now)
            return
        s.conn, s.draining, s.failures = conn, s.retired or bool(s.refused), 0
        s.watching = selectors.EVENT_READ
        s.last_progress = time.monotonic()
        log.debug("connected to data server %s", s.address)

    def _drop(self, s: _Server, reason: str, todo: collections.deque) -> None:
        if s.conn is not None:
            self._unwatch(s.conn)
            s.conn.close()
        s.conn = None
        self._failed(s, reason, time.monotonic())
        refs = [r for k, r in s.outstanding.items() if k not in self._lost]
        self._lost.difference_update(s.outstanding)
        s.outstanding.clear()
        if refs:
            self.failovers += 1
            log.warning("data server %s failed (%s); asking others for its %d unfinished batches",
                        s.address, reason, len(refs))
            self._requeue(refs, todo)

    def _refuse(self, s: _Server, reason: str, quiet: bool = False) -> None:
        """Never use registered server ``s`` (until its registry entry changes); logged once."""
        s.refused, s.draining = reason, True
        s.last_error = f"refused: {reason}"
        if not quiet:
            self._registry.refuse(s.address, s.server_id, reason)

    def _retire(self, s: _Server, why: str) -> None:
        """Ask ``s`` for nothing more; it is closed once it owes nothing (``_sync_registry``)."""
        if not s.retired:
            s.retired, s.draining = True, True
            log.info("data server %s: %s; asking it for nothing more", s.address, why)

    def _sync_registry(self, todo: collections.deque) -> None:
        """Take in servers that joined the registry, retire those that left, close retired ones
        that owe nothing."""
        version, entries = self._registry.snapshot()
        if version != self._registry_version:
            self._registry_version = version
            known = {s.address: s for s in self._servers}
            for address, entry in entries.items():
                s = known.get(address)
                if s is None:
                    if any(o.server_id == entry.server_id and o.conn is not None for o in self._servers):
                        continue  # a fixed server already connected under another address
                    self._servers.append(_Server(address, registered=True, late=self._iterating,
                                                 server_id=entry.server_id))
                    log.log(logging.INFO if self._iterating else logging.DEBUG, "data server %s joined (registry %s)",
                            address, self._registry.uri)
                elif s.registered and (s.retired or s.server_id != entry.server_id):
                    # back in the registry, or another server at the same address: a fresh start
                    s.retired = s.draining = False
                    s.refused, s.server_id, s.failures, s.retry_at = "", entry.server_id, 0, 0.0
            for s in self._servers:
                if s.registered and s.address not in entries:
                    self._retire(s, f"left registry {self._registry.uri}")
        for s in [s for s in self._servers if (s.retired or s.refused) and not s.outstanding]:
            if s.conn is not None:
                self._unwatch(s.conn)
                s.conn.close()
                s.conn = None
            if s.registered and s.address not in entries and s.connecting is None:
                self._servers.remove(s)

    @staticmethod
    def _failed(s: _Server, reason: str, now: float) -> None:
        """Note why ``s`` is unusable and when to try it again (back-off by its failures in a row)."""
        s.failures += 1
        s.retry_at = now + RETRY_S[min(s.failures - 1, len(RETRY_S) - 1)]
        s.last_error = reason

    def _unwatch(self, conn: BulkConnection) -> None:
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass

    def _requeue(self, refs: list[pb.BatchRef], todo: collections.deque) -> None:
        """Ask again for ``refs`` (those no other server has outstanding, hedged ones): ``todo``
        stays in order, which ``_assign``'s bound relies on."""
        refs = [r for r in refs if not any(_key(r) in o.outstanding for o in self._servers)]
        if not refs:
            return
        pos = self._pos
        last = max(pos[_key(r)] for r in refs)
        # ``todo`` is sorted: only its head, up to the last requeued position, needs merging
        # (not the rest of an epoch's list).
        head = []
        while todo and pos[_key(todo[0])] < last:
            head.append(todo.popleft())
        todo.extendleft(sorted([*head, *refs], key=lambda r: pos[_key(r)], reverse=True))

    def _unavailable(self, waited: float) -> ServerUnavailableError:
        detail = "; ".join(f"{s.address}: {s.last_error}" for s in self._servers) or "no server known"
        if self._registry is not None:
            state = f"cannot be read: {self._registry.error}" if self._registry.error else "readable"
            detail += f"; registry {self._registry.uri} {state}"
        return ServerUnavailableError(
            f"no data server usable for {waited:.1f}s (connect_timeout={self._connect_timeout}s): {detail}")

    # -- iteration
    def __iter__(self) -> Iterator[tuple[pb.BatchRef, Any]]:
        self._pos = {_key(r): i for i, r in enumerate(self._refs)}
        if len(self._pos) != len(self._refs):
            raise ConfigError("refs must be unique (seed, epoch, index) triples")
        if self._affinity is not None:
            self._find_openers()
        todo: collections.deque[pb.BatchRef] = collections.deque(self._refs)
        done: dict[int, Any] = {}
        nxt = 0
        self._hedged.clear()
        no_server_since: float | None = None
        if self._sel is None:  # a Fetcher that took over open connections has their selector
            self._sel = selectors.DefaultSelector()
        if self._registry is not None:
            self._sync_registry(todo)
            for s in self._servers:
                s.late = False  # known as this iteration starts: owners like the fixed ones
        self._iterating = True
        complete = False
        try:
            while nxt < len(self._refs):
                while nxt in done:
                    yield self._refs[nxt], done.pop(nxt)
                    nxt += 1
                if nxt >= len(self._refs):
                    break
                now = time.monotonic()
                connecting = False
                if self._registry is not None:
                    self._sync_registry(todo)
                for s in self._servers:
                    if s.connecting is not None and s.connecting.done:
                        self._finish_connect(s, now)
                    elif (s.connecting is None and s.conn is None and now >= s.retry_at
                          and not s.retired and not s.refused):
                        self._start_connect(s)
                    connecting = connecting or s.connecting is not None
                    if s.conn is not None and s.outstanding and now - s.last_progress > self._batch_timeout:
                        self._drop(s, f"no batch for {self._batch_timeout:.0f}s", todo)
                self._assign(todo, nxt)
                usable = any(s.conn is not None and (not s.draining or s.outstanding) for s in self._servers)
                if usable:
                    no_server_since = None
                elif no_server_since is None:
                    no_server_since = now
                elif now - no_server_since > self._connect_timeout:
                    raise self._unavailable(now - no_server_since)
                # An attempt in flight: take its connection into the loop soon after it opens.
                # With a registry the loop looks at it at least every REGISTRY_TURN_S: a server that
                # joins is taken in soon after the watcher has read its entry.
                idle = 0.5 if self._registry is None else REGISTRY_TURN_S
                self._wait(CONNECT_POLL_S if connecting else 0.1 if not usable else idle, todo, done)
            complete = True
        finally:
            if complete and self._keep_open:
                self._open = True
            else:
                self.close()

    def close(self) -> None:
        """Close every connection (also those a complete ``keep_open`` iteration left open)."""
        self._open = False
        for s in self._servers:
            attempt, s.connecting = s.connecting, None
            if attempt is not None:
                with attempt.lock:
                    attempt.abandoned = True
                    opened = attempt.conn if attempt.done else None
                if opened is not None:
                    opened.close()
            if s.conn is not None:
                if self._sel is not None:
                    self._unwatch(s.conn)
                s.conn.close()
                s.conn = None
        if self._sel is not None:
            self._sel.close()
            self._sel = None

    def _wait(self, timeout: float, todo: collections.deque, done: dict[int, Any]) -> None:
        """Write what waits to be written, then handle whatever the servers sent (up to ``timeout``)."""
        for s in self._servers:
            conn = s.conn
            if conn is None:
                continue
            try:
                conn.flush()
            except OSError as exc:
                self._drop(s, f"send failed: {exc}", todo)
                continue
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.wants_write else 0)
            if want != s.watching:
                self._sel.modify(conn, want, conn)
                s.watching = want
        if not self._sel.get_map():
            time.sleep(timeout)
            return
        behind = [s.conn for s in self._servers if s.conn is not None and s.conn.backlog]
        held = [s.conn for s in self._servers if s.conn is not None and s.conn.lowat]
        if held:  # a payload rest the kernel holds back (low-water mark) is read anyway after a while
            timeout = min(timeout, LOWAT_CHECK_S)
        ready = [key.data for key, _ in self._sel.select(0.0 if behind else timeout)]
        if held:
            now = time.monotonic()
            behind += [c for c in held if c.held_back(now)]
        if behind:
            ready += [c for c in behind if c not in ready]
        for conn in ready:
            for event in conn.read_events():
                self._handle(event, todo, done)

    def _assign(self, todo: collections.deque, nxt: int) -> None:
        """Top up each server's window with the next batches of ``todo``, none of them more than
        the bound ahead of ``nxt`` (the position the consumer waits for); hedge ``nxt`` if due."""
        limit = nxt + AHEAD_WINDOWS * self._window * max(1, sum(1 for s in self._servers if not s.refused))
        if self._affinity is not None:
            self._assign_owned(todo, nxt, limit)
            return
        held_back = False  # a server had room, but the next batch is too far ahead
        for s in self._servers:
            if s.conn is None or s.draining or not todo:
                continue
            room = self._window - len(s.outstanding)
            if s.outstanding and room < self._refill:
                continue  # ask again once half a window is free (see __init__)
            batch = []
            while room > 0 and todo and self._pos[_key(todo[0])] < limit:
                ref = todo.popleft()
                batch.append(ref)
                room -= 1
            held_back = held_back or room > 0 and bool(todo)
            if batch:
                self._send(s, batch, todo)
        if held_back:
            self._hedge(todo, nxt)
        elif not todo:
            self._hedge(todo, nxt, tail=True)

    def _owners(self) -> tuple[str, ...]:
        """Servers that own blocks now: connected and not draining, or on their first connection
        attempt (so a slow start does not hand a server's blocks to another for good)."""
        return tuple(s.address for s in self._servers if not s.draining and not s.refused and (
            s.conn is not None or (s.connecting is not None and s.failures == 0 and not s.late)))

    def _assign_owned(self, todo: collections.deque, nxt: int, limit: int) -> None:
        """``_assign`` with affinity: each server takes the batches of the blocks it owns; one with
        room and nothing of its own takes batches of blocks it built lately."""
        head = []
        while todo and self._pos[_key(todo[0])] < limit:
            head.append(todo.popleft())
        live = self._owners()
        mine: dict[str, list[pb.BatchRef]] = collections.defaultdict(list)
        for ref in head:
            mine[self._affinity.owner(ref, live)].append(ref)
        plan: list[tuple[_Server, list[pb.BatchRef]]] = []
        idle = False
        for s in self._servers:
            if s.conn is None or s.draining:
                continue
            room = self._window - len(s.outstanding)
            if s.outstanding and room < self._refill:
                continue
            take = mine[s.address][:room]
            del mine[s.address][:room]
            if len(take) < room and not s.outstanding and s.blocks:
                # idle: batches of blocks it built lately cost no extra read; the earliest first
                extra = sorted((r for a, refs in mine.items() if a != s.address for r in refs
                                if self._affinity.block(r) in s.blocks), key=lambda r: self._pos[_key(r)])
                extra = extra[:room - len(take)]
                for r in extra:
                    mine[self._affinity.owner(r, live)].remove(r)
                take += extra
            idle = idle or (not take and not s.outstanding)
            if take:
                plan.append((s, take))
        rest = sorted((r for refs in mine.values() for r in refs), key=lambda r: self._pos[_key(r)])
        todo.extendleft(reversed(rest))  # before sending: a failed send requeues into a sorted ``todo``
        for s, take in plan:
            self._send(s, take, todo)
        self._hint(limit, live)
        if idle or not todo:
            self._hedge(todo, nxt, tail=True)

    def _find_openers(self) -> None:
        """Positions of the first batch of each block in the list (what ``_hint`` announces)."""
        seen: set[tuple[int, int]] = set()
        self._openers: list[int] = []
        for i, ref in enumerate(self._refs):
            block = (ref.epoch, self._affinity.block(ref))
            if block not in seen:
                seen.add(block)
                self._openers.append(i)
        self._next_opener = 0

    def _hint(self, limit: int, live: tuple[str, ...]) -> None:
        """Tell each owner about its blocks that start within the next ``hint_ahead`` places beyond
        the ask-ahead bound, so its data arrives before the first batch of the block is asked for."""
        if any(s.conn is None for s in self._servers if s.address in live):
            return  # an owner still connecting: announce once it can hear
        horizon = limit + self._affinity.hint_ahead
        hints: dict[str, list[pb.BatchRef]] = collections.defaultdict(list)
        while self._next_opener < len(self._openers) and self._openers[self._next_opener] < horizon:
            i = self._openers[self._next_opener]
            self._next_opener += 1
            if i >= limit:  # nearer ones are asked for already, which starts their fetch too
                hints[self._affinity.owner(self._refs[i], live)].append(self._refs[i])
        for s in self._servers:
            if hints.get(s.address) and s.conn is not None:
                try:
                    s.conn.hint(hints[s.address])
                except OSError:
                    pass  # the connection's failure is noticed, and handled, on its next read

    def _send(self, s: _Server, batch: list[pb.BatchRef], todo: collections.deque) -> None:
        for ref in batch:
            s.outstanding[_key(ref)] = ref
        if not s.last_progress or len(s.outstanding) == len(batch):
            s.last_progress = time.monotonic()
        try:
            s.conn.fetch(batch)
        except OSError as exc:
            self._drop(s, f"send failed: {exc}", todo)

    def _hedge(self, todo: collections.deque, nxt: int, tail: bool = False) -> None:
        """Ask the least busy other server for the batch the consumer waits for too, once; at the
        ``tail`` of the list only if its server has been quiet for long (module docstring)."""
        ref = self._refs[nxt]
        key = _key(ref)
        if key in self._hedged:
            return
        holder = next((s for s in self._servers if key in s.outstanding), None)
        if holder is None:
            return  # arrived already
        first = HEDGE_AFFINITY_S if self._affinity is not None else HEDGE_TAIL_S
        quiet_for = max(first, HEDGE_TAIL_GAPS * holder.gap) if tail else 0.0
        if time.monotonic() - holder.last_progress < quiet_for:
            return  # its server is still delivering
        others = [s for s in self._servers if s.conn is not None and not s.draining and key not in s.outstanding
                  and len(s.outstanding) < self._window]
        if not others:
            return
        self._hedged.add(key)
        self.hedges += 1
        target = min(others, key=lambda s: len(s.outstanding))
        log.debug("epoch %d batch %d waited on %s; asking %s too", ref.epoch, ref.index,
                  holder.address, target.address)
        self._send(target, [ref], todo)

    def _server_of(self, conn: BulkConnection) -> _Server | None:
        for s in self._servers:
            if s.conn is conn:
                return s
        return None  # an old connection's late event

    def _handle(self, ev: Event, todo: collections.deque, done: dict[int, Any]) -> None:
        s = self._server_of(ev.conn)
        if s is None:
            return
        if ev.kind == "down":
            self._drop(s, f"{type(ev.exc).__name__}: {ev.exc}", todo)
            return
        key = _key(ev.ref)
        if s.outstanding.pop(key, None) is None:
            return  # not ours (already re-requested elsewhere)
        now = s.last_progress = time.monotonic()
        if key in self._lost:  # a hedged batch's second copy: the first was used
            self._lost.discard(key)
            return
        if ev.kind == "batch":
            s.delivered += 1
            if s.last_batch:
                s.gap = 0.8 * s.gap + 0.2 * (now - s.last_batch) if s.gap else now - s.last_batch
            s.last_batch = now
            if self._affinity is not None:
                block = self._affinity.block(ev.ref)
                s.blocks.pop(block, None)
                s.blocks[block] = None
                if len(s.blocks) > BLOCKS_REMEMBERED:
                    del s.blocks[next(iter(s.blocks))]
            if key in self._hedged:
                self._hedged.discard(key)
                if any(key in o.outstanding for o in self._servers):
                    self._lost.add(key)
            if self._small_window:
                want = self._small_window if ev.nbytes <= SMALL_BATCH_BYTES else self._base_window
                if want != self._window:
                    self._set_window(want)
            done[self._pos[key]] = ev.batch
            self.most_held = max(self.most_held, len(done))
            return
        err = ev.error
        if err.kind == pb.SHUTTING_DOWN:
            s.draining = True
            s.last_error = err.message or "shutting down"
            self._requeue([ev.ref], todo)
            return
        if err.kind == pb.TRANSFORM_FAILED:
            raise BatchBuildError(err.message, epoch=ev.ref.epoch, index=ev.ref.index,
                                  sample_index=err.sample_index, remote_traceback=err.traceback, server=s.address)
        raise DataServiceError(f"server {s.address} could not build epoch {ev.ref.epoch} batch {ev.ref.index}: "
                               f"{pb.ErrorKind.Name(err.kind)}: {err.message}")

    def stats(self) -> dict[str, int]:
        return {s.address: s.delivered for s in self._servers}
