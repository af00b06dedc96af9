"""A data server joins a running job: its registry entry, the address it gives, leaving first.

    server = DataServer(spec, token, ServerOptions(host="0.0.0.0", port=6000)).start()
    join(server, "s3://bucket/job/registry", f"{default_advertise_host()}:{server.port}")

``join`` registers the started server (``data_service.membership.registry``), refreshes its entry every third
of ``ttl_s`` (``Heartbeat``: a server killed with -9 expires within the TTL) and makes its shutdown
stop the heartbeat and remove the entry before it refuses new requests, then keep serving
``leave_delay_s`` while consumers notice. The removal is the entry's last write: no beat starts
after it, and one in flight that outlasts the wait for it removes the entry again once it returns.
"""
from __future__ import annotations

import contextlib
import logging
import threading

from ..errors import ConfigError
from .registry import DEFAULT_TTL_S, Entry, RegistryError, check_uri, register, unregister

log = logging.getLogger(__name__)


class Heartbeat:
    """Rewrites one server's registry entry every ``ttl_s / 3`` seconds on a thread of its own.

    A failed write is logged (once until one succeeds again) and retried at the next beat: the
    entry expires only when writes fail for the whole TTL. ``stop`` ends the beats and waits for
    one in flight; ``leave`` stops them and removes the entry for good.
    """

    def __init__(self, uri: str, token: str, entry: Entry, *, timeout_s: float = 10.0) -> None:
        if not entry.ttl_s > 0:
            raise ConfigError(f"ttl_s={entry.ttl_s!r}: a heartbeat needs an entry with a TTL > 0")
        self.uri, self.token, self.entry, self.timeout_s = uri, token, entry, timeout_s
        self.beats = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()  # orders a beat's start against ``leave``
        self._left = False
        self._failing = False
        self._thread = threading.Thread(target=self._run, name=f"heartbeat {entry.server_id}", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """End the beats; waits (up to ``timeout``, default one write's deadline) for one in flight."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.timeout_s if timeout is None else timeout)

    def leave(self, timeout: float | None = None) -> None:
        """Stop the beats and remove the entry; the removal is its last write.

        No beat starts once this is called; one in flight is waited for (up to ``timeout``,
        default one write's deadline). Should it outlast the wait, it lands after this removal,
        and the heartbeat's thread removes the entry again as soon as the write returns.

        Raises:
            RegistryError: the delete failed (the entry then expires ``ttl_s`` after its last beat).
        """
        with self._lock:
            self._left = True
        self.stop(timeout)
        unregister(self.uri, self.entry.server_id, timeout_s=self.timeout_s)

    def _run(self) -> None:
        e = self.entry
        # a write may take up to its deadline: beat early enough that it lands within the TTL
        every = max(0.05, min(e.ttl_s / 3, e.ttl_s - self.timeout_s) if e.ttl_s > self.timeout_s else e.ttl_s / 3)
        while not self._stop.wait(every):
            with self._lock:
                if self._left:
                    return
            try:
                register(self.uri, self.token, e.server_id, e.address, e.fingerprint,
                         timeout_s=min(self.timeout_s, e.ttl_s), started_at=e.started_at, ttl_s=e.ttl_s)
                self.beats += 1
                if self._failing:
                    log.info("registry %s: entry of %s refreshed again", self.uri, e.server_id)
                self._failing = False
            except (RegistryError, ConfigError, OSError) as exc:
                if not self._failing:
                    log.warning("registry %s: cannot refresh the entry of %s (%s); consumers drop it %g s after "
                                "its last refresh unless a retry succeeds", self.uri, e.server_id, exc, e.ttl_s)
                self._failing = True
            with self._lock:
                late = self._left
            if late:  # ``leave`` ran during this write, which may have put the entry back
                self._remove_again()
                return

    def _remove_again(self) -> None:
        try:
            unregister(self.uri, self.entry.server_id, timeout_s=self.timeout_s)
        except (RegistryError, ConfigError, OSError) as exc:
            log.warning("registry %s: cannot remove the entry of %s again after a refresh that outlasted its "
                        "leaving (%s); consumers drop it %g s after that refresh", self.uri, self.entry.server_id,
                        exc, self.entry.ttl_s)


def default_advertise_host(bind_host: str = "0.0.0.0") -> str:
    """The address other machines reach this one at, for a server's registry entry.

    A specific ``bind_host`` is that address. Listening on every interface, it is the address of
    the interface the default route leaves by (an EC2 instance's or ECS task's private IP, a
    Kubernetes pod's IP), else what the host name resolves to. Pass ``--advertise-host`` where
    neither is what consumers dial (a NAT, a port mapping, a load balancer).
    """
    import socket

    if bind_host and bind_host not in ("0.0.0.0", "::", "[::]"):
        return bind_host
    with contextlib.suppress(OSError):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.254.254.254", 9))  # no packet is sent: only the route is looked up
            ip = s.getsockname()[0]
        if ip and not ip.startswith("127.") and ip != "0.0.0.0":
            return ip
    with contextlib.suppress(OSError):
        ip = socket.gethostbyname(socket.gethostname())
        if not ip.startswith("127."):
            return ip
    return socket.gethostname()


def join(server, uri: str, address: str, *, leave_delay_s: float = 2.0, timeout_s: float = 10.0,
         ttl_s: float = DEFAULT_TTL_S) -> Entry:
    """Register a started ``DataServer`` at ``address``, keep its entry fresh, and unregister it
    first when it leaves.

    The server keeps serving ``leave_delay_s`` after its entry is gone (consumers poll the
    registry about every second), then refuses new requests and finishes what it owes.
    ``ttl_s``: consumers drop the entry this long after its last refresh (0: no heartbeat, the
    entry stays until removed).

    Raises:
        ConfigError, RegistryError: see ``register``.
    """
    uri = check_uri(uri)
    entry = register(uri, server.token, server.server_id, address, server.dataset_info.fingerprint,
                     timeout_s=timeout_s, started_at=getattr(server, "created_at", None), ttl_s=ttl_s)
    beat = Heartbeat(uri, server.token, entry, timeout_s=timeout_s).start() if ttl_s > 0 else None

    def unregister_entry() -> None:
        if beat is not None:
            beat.leave()
        else:
            unregister(uri, server.server_id, timeout_s=timeout_s)

    server.on_leave(unregister_entry)
    server.leave_delay_s = leave_delay_s
    return entry
