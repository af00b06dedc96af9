"""A data server that leaves once its last consumer has been gone for a while: the data group of a
sweep ends when the last job leaves, so a data-only job never bills idle for long.

Jobs come and go: each job's consumers connect for its epochs and go when it ends (between two
epochs a job keeps its connections, or opens new ones at once). When no consumer has been
connected for ``idle_s`` seconds, after at least one came, the server shuts down as after
``hetero shutdown`` (leaving its registry first, if it joined one). A server nobody ever used
waits for its first consumer without a deadline here: a sweep's data group starts before its jobs.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..protocol.generated import pb

log = logging.getLogger(__name__)


class _Stats(Protocol):
    def snapshot(self) -> pb.Stats: ...


class _Server(Protocol):
    server_id: str

    @property
    def stats(self) -> _Stats: ...

    def wait(self, timeout: float | None = None) -> bool: ...
    def shutdown(self, grace_s: float = 30.0, reason: str = "", block: bool = True) -> bool: ...


@dataclass(frozen=True)
class IdleExit:
    """When an unused data server leaves.

    Args:
        idle_s: seconds with no consumer connected, once one came, before the server leaves (> 0).
        grace_s: the shutdown's grace for requests in flight (none are left by then).
    """

    idle_s: float
    grace_s: float = 5.0

    def __post_init__(self) -> None:
        if not (isinstance(self.idle_s, (int, float)) and 0 < self.idle_s < float("inf")):
            raise ConfigError(f"idle_timeout={self.idle_s!r} must be > 0 seconds: how long a data server waits "
                              "after its last consumer left before it shuts down")

    def reason(self, ever_connected: bool, seconds_since_last_consumer: float) -> str | None:
        """Why the server should leave now, or None to keep serving."""
        if ever_connected and seconds_since_last_consumer > self.idle_s:
            return (f"no consumer for {seconds_since_last_consumer:.0f}s (idle timeout {self.idle_s:g}s): "
                    "the last job has left")
        return None

    def watch(self, server: _Server, poll_s: float = 1.0) -> "IdleWatch":
        """Check ``server`` every ``poll_s`` seconds on a daemon thread, shutting it down when idle."""
        watch = IdleWatch(self, server, poll_s)
        watch.start()
        return watch


class IdleWatch(threading.Thread):
    """The thread of ``IdleExit.watch``; ``reason`` says why it shut the server down ("" until it did)."""

    def __init__(self, rule: IdleExit, server: _Server, poll_s: float) -> None:
        super().__init__(name="idle-exit", daemon=True)
        self.rule = rule
        self.server = server
        self.poll_s = poll_s
        self.reason = ""

    def run(self) -> None:
        server = self.server
        while not server.wait(self.poll_s):
            snap = server.stats.snapshot()
            why = self.rule.reason(snap.consumer_ever_connected, snap.seconds_since_last_consumer)
            if why is not None:
                self.reason = why
                log.info("data server %s leaves: %s", server.server_id, why)
                server.shutdown(grace_s=self.rule.grace_s, reason=why, block=False)
                return
