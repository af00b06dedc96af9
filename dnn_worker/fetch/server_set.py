"""The data servers one consumer uses: connecting, membership, and the sockets' events.

A ``ServerSet`` holds the servers of a fixed list and, with a registry
(``registry_watch.RegistryWatcher``), those that join and leave while the list is fetched. It
connects each on a short-lived thread (``fetch_options.Attempt``), backs off a failing server
(``RETRY_S``), refuses for good a registered server that cannot prove the token or serves another
pipeline (logged, not fatal; a fixed server doing that is a configuration error), uses one server
known under a fixed and a registered address once, retires a server whose entry is gone (asked
for nothing more, closed once it owes nothing) and reads every connection's frames on the
calling thread (``wait``) through one ``Selector``, which a finished attempt wakes (``waker``).
What to ask of whom is the scheduler's job.
"""
from __future__ import annotations

import contextlib
import logging
import selectors
import time
from dataclasses import dataclass
from typing import Callable, cast

import grpc

from data_service.contract.batch_id import BatchId
from data_service.protocol.addresses import split_address
from data_service.errors import (ConfigError, DataServiceError, PermissionDeniedError, ProtocolError,
                                 ServerUnavailableError, VersionMismatchError)
from data_service.protocol.generated import pb
from data_service.protocol.waker import Waker

from ..transport.connection import LOWAT_CHECK_S, BulkConnection, Event
from .fetch_options import Attempt, FetchOptions
from .registry_watch import RegistryWatcher

log = logging.getLogger(__name__)

RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # back-off between reconnects to one server


@dataclass
class Server:
    """One data server's connection state (``ServerSet.servers``)."""

    address: str
    conn: BulkConnection | None = None
    hello: pb.HelloResponse | None = None
    attempt: Attempt | None = None  # a connection attempt in flight
    draining: bool = False
    failures: int = 0           # connections in a row that failed before delivering a batch
    retry_at: float = 0.0
    last_error: str = "never connected"
    server_id: str = ""         # from its Hello (or its registry entry)
    registered: bool = False    # came from the registry (not the fixed list)
    late: bool = False          # joined mid-iteration: owns blocks only once connected
    retired: bool = False       # its registry entry is gone: asked for nothing more
    refused: str = ""           # why it is never used (registered servers only)


class ServerSet:
    """See the module docstring. ``fixed``: ``host:port`` addresses; ``registry``: a watcher or None."""

    def __init__(self, fixed: list[str], options: FetchOptions, registry: RegistryWatcher | None = None) -> None:
        if not fixed and registry is None:
            raise ConfigError("servers=[] : give at least one data server address 'host:port', or a registry")
        for address in fixed:
            split_address(address)
        self.fixed = list(fixed)
        self.options = options
        self.registry = registry
        self.fingerprint = options.fingerprint
        self.servers = [Server(a) for a in fixed]
        self._registry_version = -1
        self._selector: Selector | None = Selector()

    def _open_selector(self, what: str) -> "Selector":
        if self._selector is None:
            raise RuntimeError(f"ServerSet.{what}: this set is closed (its selector is None)")
        return self._selector

    def take_over(self, other: "ServerSet") -> bool:
        """Take ``other``'s open connections (the same servers; the next epoch of a persistent
        loader worker) instead of connecting again; False when they do not match."""
        if (other._selector is None or other.fixed != self.fixed or other.registry is not self.registry
                or not all(s.address in self.fixed or s.registered for s in other.servers)):
            return False
        self._open_selector("take_over").close()
        # its waker comes along: attempts still in flight wake this set
        self.servers, self._selector, self.fingerprint = other.servers, other._selector, other.fingerprint
        self._registry_version = other._registry_version
        other.servers, other._selector = [], None
        return True

    def get(self, address: str) -> Server | None:
        return next((s for s in self.servers if s.address == address), None)

    def usable(self) -> list[str]:
        """Servers that may be asked for batches: connected and not draining."""
        return [s.address for s in self.servers if s.conn is not None and not s.draining]

    def owners(self) -> tuple[str, ...]:
        """Servers that own blocks now: connected and not draining, or on their first connection
        attempt (so a slow start does not hand a server's blocks to another for good)."""
        return tuple(s.address for s in self.servers if not s.draining and not s.refused and (
            s.conn is not None or (s.attempt is not None and s.failures == 0 and not s.late)))

    def hears_hints(self, owners: tuple[str, ...]) -> bool:
        return all(s.conn is not None for s in self.servers if s.address in owners)

    def connect(self, now: float) -> list[Server]:
        """Take finished attempts in, start due ones. Returns the servers connected now."""
        connected = []
        for s in self.servers:
            attempt = s.attempt
            if attempt is not None and attempt.done:
                if self._finish(s, attempt, now):
                    connected.append(s)
            elif (attempt is None and s.conn is None and now >= s.retry_at
                  and not s.retired and not s.refused):
                s.attempt = Attempt(s.address, self.options, on_done=self._open_selector("connect").waker.wake)
        return connected

    def _finish(self, s: Server, attempt: Attempt, now: float) -> bool:
        """Take ``s``'s finished ``attempt``'s connection in, or note why it failed."""
        s.attempt = None
        exc = attempt.exc
        if isinstance(exc, (PermissionDeniedError, VersionMismatchError, ConfigError)):
            if s.registered:  # a registry entry is not the user's configuration: refuse it, go on
                self._refuse(s, str(exc))
                return False
            raise exc  # refused for good: retrying cannot help
        if isinstance(exc, (grpc.RpcError, OSError, DataServiceError)):
            self._failed(s, getattr(exc, "details", lambda: None)() or f"{type(exc).__name__}: {exc}", now)
            if isinstance(exc, ProtocolError):  # the server refused a damaged hello, or spoke garbage: say so
                log.warning("data server %s: connection attempt failed (%s); trying again in %.1fs", s.address,
                            s.last_error, s.retry_at - now)
            return False
        if exc is not None:
            raise exc
        # an attempt that raised nothing set both (fetch_options.Attempt._run)
        conn, hello = cast(BulkConnection, attempt.conn), cast(pb.HelloResponse, attempt.hello)
        fp = hello.dataset.fingerprint
        if self.fingerprint and fp != self.fingerprint:
            conn.close()
            if s.registered:
                self._refuse(s, f"it runs pipeline {hello.dataset.pipeline!r} with fingerprint {fp}, "
                                f"the job runs {self.fingerprint}")
                return False
            raise ConfigError(
                f"server {s.address} runs pipeline {hello.dataset.pipeline!r} with fingerprint {fp}, "
                f"others run {self.fingerprint}: start every data server with the same pipeline and options")
        self.fingerprint = fp
        twin = next((o for o in self.servers if o is not s and o.conn is not None and hello.server_id
                     and o.server_id == hello.server_id and (s.registered or o.registered)), None)
        if twin is not None:  # one server under a fixed and a registered address: use it once
            if s.registered or not twin.registered:
                conn.close()
                self._refuse(s, f"it is the same server as {twin.address}", quiet=True)
                return False
            self._refuse(twin, f"it is the same server as {s.address}", quiet=True)
        s.server_id = hello.server_id or s.server_id
        try:
            self._open_selector("connect").add(conn)
        except (OSError, ValueError, KeyError) as exc:
            conn.close()
            self._failed(s, f"{type(exc).__name__}: {exc}", now)
            return False
        # ``failures`` stays until the connection delivers (Fetcher): one that breaks before every
        # batch backs off further each time instead of reconnecting every 0.2 s
        s.conn, s.hello, s.draining = conn, hello, s.retired or bool(s.refused)
        log.debug("connected to data server %s", s.address)
        return True

    def drop(self, address: str, reason: str) -> None:
        """Close ``address``'s connection and back off before the next attempt."""
        s = self.get(address)
        if s is None:
            return
        self._close(s)
        self._failed(s, reason, time.monotonic())

    def drain(self, address: str, reason: str) -> None:
        """``address`` is shutting down: ask it for nothing more."""
        s = self.get(address)
        if s is not None:
            s.draining, s.last_error = True, reason

    def sync_registry(self, iterating: bool, owes: Callable[[str], bool]) -> list[str]:
        """Take in servers that joined the registry, retire those that left, close retired ones
        that owe nothing. Returns the addresses no longer known."""
        registry = self.registry
        if registry is None:
            raise RuntimeError("ServerSet.sync_registry: this set has no registry (self.registry is None)")
        version, entries = registry.snapshot()
        if version != self._registry_version:
            self._registry_version = version
            known = {s.address: s for s in self.servers}
            for address, entry in entries.items():
                s = known.get(address)
                if s is None:
                    if any(o.server_id == entry.server_id and o.conn is not None for o in self.servers):
                        continue  # a fixed server already connected under another address
                    self.servers.append(Server(address, registered=True, late=iterating, server_id=entry.server_id))
                    log.log(logging.INFO if iterating else logging.DEBUG, "data server %s joined (registry %s)",
                            address, registry.uri)
                elif s.registered and (s.retired or s.server_id != entry.server_id):
                    # back in the registry, or another server at the same address: a fresh start
                    s.retired = s.draining = False
                    s.refused, s.server_id, s.failures, s.retry_at = "", entry.server_id, 0, 0.0
            for s in self.servers:
                if s.registered and s.address not in entries and not s.retired:
                    s.retired = s.draining = True
                    log.info("data server %s: left registry %s; asking it for nothing more", s.address,
                             registry.uri)
        gone = []
        for s in [s for s in self.servers if (s.retired or s.refused) and not owes(s.address)]:
            self._close(s)
            if s.registered and s.address not in entries and s.attempt is None:
                self.servers.remove(s)
                gone.append(s.address)
        return gone

    def joined_now(self) -> None:
        """Servers known as an iteration starts own blocks like the fixed ones."""
        for s in self.servers:
            s.late = False

    def _refuse(self, s: Server, reason: str, quiet: bool = False) -> None:
        """Never use registered server ``s`` (until its registry entry changes); logged once."""
        s.refused, s.draining = reason, True
        s.last_error = f"refused: {reason}"
        if not quiet:
            # only registered servers are refused, and only a set with a registry has them
            cast(RegistryWatcher, self.registry).refuse(s.address, s.server_id, reason)

    @staticmethod
    def _failed(s: Server, reason: str, now: float) -> None:
        """Note why ``s`` is unusable and when to try it again (back-off by its failures in a row)."""
        s.failures += 1
        s.retry_at = now + RETRY_S[min(s.failures - 1, len(RETRY_S) - 1)]
        s.last_error = reason

    def _close(self, s: Server) -> None:
        if s.conn is not None:
            if self._selector is not None:  # None once closed or taken over: nothing to unregister
                self._selector.remove(s.conn)
            s.conn.close()
            s.conn = None

    def send(self, address: str, batches: list[BatchId], hint: bool = False) -> str | None:
        """Ask (or, with ``hint``, tell of blocks ahead) ``address``; the error text on failure."""
        s = self.get(address)
        if s is None or s.conn is None:
            return None if hint else "not connected"
        try:
            (s.conn.hint if hint else s.conn.fetch)(batches)
        except OSError as exc:
            return None if hint else f"send failed: {exc}"  # a failed hint is noticed on the next read
        return None

    def wait(self, timeout: float) -> list[tuple[Server, Event]]:
        """Write what waits to be written, then read whatever the servers sent (up to ``timeout``)."""
        by_conn = {id(s.conn): s for s in self.servers if s.conn is not None}
        events = self._open_selector("wait").wait([s.conn for s in self.servers if s.conn is not None], timeout)
        # an event of a connection no server holds now is an old connection's, late
        return [(s, e) for e in events if (s := by_conn.get(id(e.conn))) is not None and s.conn is e.conn]

    def close(self) -> None:
        """Close every connection and attempt."""
        for s in self.servers:
            attempt, s.attempt = s.attempt, None
            if attempt is not None:
                attempt.abandon()
            self._close(s)
        if self._selector is not None:
            self._selector.close()
            self._selector = None

    def unavailable(self, waited: float) -> ServerUnavailableError:
        detail = "; ".join(f"{s.address}: {s.last_error}" for s in self.servers) or "no server known"
        if self.registry is not None:
            state = f"cannot be read: {self.registry.error}" if self.registry.error else "readable"
            detail += f"; registry {self.registry.uri} {state}"
        return ServerUnavailableError(
            f"no data server usable for {waited:.1f}s (connect_timeout={self.options.connect_timeout}s): {detail}")


class Selector:
    """Every connection's frames, read on the calling thread: one selector over their sockets, and
    ``waker``, which a finished connection attempt sets off so that ``wait`` ends at once."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self.waker = Waker()
        self._sel.register(self.waker, selectors.EVENT_READ, self.waker)
        self._watching: dict[BulkConnection, int] = {}  # the events registered for each connection

    def add(self, conn: BulkConnection) -> None:
        self._sel.register(conn, selectors.EVENT_READ, conn)
        self._watching[conn] = selectors.EVENT_READ

    def remove(self, conn: BulkConnection) -> None:
        self._watching.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, AttributeError):
            self._sel.unregister(conn)

    def wait(self, conns: list[BulkConnection], timeout: float) -> list[Event]:
        """Write what waits to be written on ``conns``, then read whatever they sent (up to ``timeout``);
        a connection that cannot write gives a ``"down"`` event, and only those come back then."""
        events = []
        for conn in conns:
            try:
                conn.flush()
            except OSError as exc:
                events.append(Event("down", conn, exc=exc))
                continue
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.wants_write else 0)
            if want != self._watching.get(conn):
                self._sel.modify(conn, want, conn)
                self._watching[conn] = want
        if events:
            return events
        behind = [c for c in conns if c.backlog]
        held = [c for c in conns if c.lowat]
        if held:  # a payload rest the kernel holds back (low-water mark) is read anyway after a while
            timeout = min(timeout, LOWAT_CHECK_S)
        ready = [key.data for key, _ in self._sel.select(0.0 if behind else timeout)]
        if self.waker in ready:  # an attempt finished: ``connect`` takes it in on this turn
            self.waker.drain()
            ready.remove(self.waker)
        if held:
            now = time.monotonic()
            behind += [c for c in held if c.held_back(now)]
        ready += [c for c in behind if c not in ready]
        for conn in ready:
            events += conn.read_events()
        return events

    def close(self) -> None:
        self._sel.close()
        self.waker.close()
