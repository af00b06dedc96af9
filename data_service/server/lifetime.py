"""A started data server's life to its end, the same for ``hetero serve`` and the launcher's data node:
its registry entry (made once it serves, removed however it ends), SIGTERM and SIGINT, and when an
unattended server leaves (``IdleExit``), with which exit code.

Each job's consumers connect for its epochs and go when it ends. A server whose consumers have all been
gone for ``idle_s`` has outlived its jobs; one no consumer reached within ``connect_s`` serves jobs that
never came (failed at start, or another token). Either way it shuts down as after ``hetero shutdown``, so
an unattended server never bills idle for long.
"""
from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..errors import ConfigError
from ..membership.joining import join
from ..membership.registry import RegistryError, unregister

if TYPE_CHECKING:
    from ..protocol.generated import pb
    from .data_server import DataServer

log = logging.getLogger(__name__)

EXIT_NO_CONSUMER = 3     # no consumer came within connect_s
EXIT_CONSUMERS_GONE = 4  # every consumer gone for idle_s and no shutdown came: the job it served failed


@dataclass(frozen=True)
class IdleExit:
    """When an unattended data server leaves, and its exit code.

    Args:
        idle_s: seconds with no consumer connected, once one came, before it leaves (> 0; None: never).
        connect_s: seconds from its start for a first consumer to come (``watchdog_connect_s``; > 0;
            None: no deadline, for a server that may start long before its jobs, or join a running one).
        idle_code: the exit code once idle: 0 where its jobs leaving is how it ends (a sweep's data
            group, a server joining another job), ``EXIT_CONSUMERS_GONE`` where a shutdown should have come.
        idle_option: the option that sets ``idle_s``, named in messages.
        grace_s: the shutdown's grace for requests in flight (none are left by then).
    """

    idle_s: float | None = None
    connect_s: float | None = None
    idle_code: int = 0
    idle_option: str = "idle_timeout"
    grace_s: float = 5.0

    def __post_init__(self) -> None:
        for option, value in ((self.idle_option, self.idle_s), ("watchdog_connect_s", self.connect_s)):
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ConfigError(f"{option}={value!r} must be > 0 seconds: how long a data server waits for its "
                                  "consumers before it shuts down")

    def verdict(self, ever_connected: bool, seconds_since_last_consumer: float,
                uptime_s: float) -> tuple[int, str] | None:
        """None to keep serving, else (exit code, why the server leaves)."""
        if not ever_connected:
            if self.connect_s is not None and uptime_s > self.connect_s:
                return EXIT_NO_CONSUMER, (f"no consumer connected within watchdog_connect_s={self.connect_s:g}s; "
                                          "are the DNN nodes running with the same job token?")
            return None
        if self.idle_s is None or seconds_since_last_consumer <= self.idle_s:
            return None
        gone = f"all consumers gone for {seconds_since_last_consumer:.0f}s ({self.idle_option}={self.idle_s:g}s)"
        return self.idle_code, gone + (": the last job has left" if self.idle_code == 0 else " and no shutdown came")


@dataclass
class ServerLife:
    """Drives a started server to its end: :meth:`join` a registry (optional), then :meth:`run`. From
    its making on (on the main thread), SIGTERM and SIGINT shut the server down.

    Args:
        server: a started ``DataServer``.
        policy: when it leaves unattended (default: never).
        signal_grace_s: on SIGTERM or SIGINT, seconds to finish the requests already taken.
    """

    server: DataServer
    policy: IdleExit = IdleExit()
    signal_grace_s: float = 10.0
    registry: str = field(default="", init=False)  # the one joined: its entry goes when serving ends

    def __post_init__(self) -> None:
        if threading.current_thread() is threading.main_thread():  # signal.signal works there only
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)

    def join(self, registry: str, address: str, **options: float) -> None:
        """Register the server in ``registry`` as ``address`` (``options``: ``membership.joining.join``'s
        ``leave_delay_s``, ``ttl_s``); it unregisters first when it leaves. Raises ConfigError or
        RegistryError, once the server has been stopped, when it cannot register."""
        try:
            join(self.server, registry, address, **options)
        except BaseException:
            self.server.shutdown(grace_s=1.0, reason="could not join")
            raise
        self.registry = registry

    def run(self, poll_s: float = 1.0, on_poll: Callable[[pb.Stats], None] | None = None) -> tuple[int, str] | None:
        """Serve until the server stops (None: a Shutdown call or a signal) or the policy says it leaves
        (its exit code and why, once it has stopped); ``on_poll`` sees the stats of every poll. The
        registry entry goes however serving ends."""
        server = self.server
        try:
            while not server.wait(timeout=poll_s):
                snap = server.stats.snapshot()
                if on_poll is not None:
                    on_poll(snap)
                verdict = self.policy.verdict(snap.consumer_ever_connected, snap.seconds_since_last_consumer,
                                              snap.uptime_s)
                if verdict is not None:
                    log.log(logging.ERROR if verdict[0] else logging.INFO, "data server %s leaves with exit code %d: "
                            "%s", server.server_id, *verdict)
                    server.leave_delay_s = 0.0  # no consumer is left to see its registry entry go
                    server.shutdown(grace_s=self.policy.grace_s, reason=verdict[1])
                    return verdict
            return None
        finally:
            if self.registry:  # however serving ended, the entry goes (a no-op after a clean leave)
                try:
                    unregister(self.registry, server.server_id)
                except RegistryError as exc:
                    log.warning("could not remove data server %s's entry from %s: %s", server.server_id,
                                self.registry, exc)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.server.shutdown(grace_s=self.signal_grace_s, reason=f"signal {signal.Signals(signum).name}", block=False)
