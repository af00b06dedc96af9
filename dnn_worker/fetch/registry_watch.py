"""Watch a job's registry of data servers (``data_service.membership.registry``) from a consumer process.

A ``RegistryWatcher`` reads the registry every ``poll_s`` seconds on a thread of its own
(each read has a deadline, and a slow read delays no batch) and keeps the servers whose entries
prove the job token and serve the job's pipeline fingerprint. ``Fetcher`` asks it for a snapshot
on every turn of its loop: a new entry becomes a new server within about ``poll_s``, a removed
entry a server that is asked for nothing more.

What is refused is logged once per entry and never used: an entry whose proof does not match the
token (a server of another job, or a forged entry), one with another pipeline's fingerprint, one
that cannot be parsed. A registry that cannot be read leaves the servers known so far in place
and logs one warning, and one line when it can be read again (not a line per poll).

One watcher per registry and token per process (``watcher_for``), shared by every iteration in
it; its thread ends after ``IDLE_STOP_S`` without a snapshot and starts again with the next one.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from data_service.membership.registry import Entry, RegistryError, check_uri, verified_entries, verify

log = logging.getLogger(__name__)

IDLE_STOP_S = 60.0  # the polling thread ends after this long without a snapshot() call


class RegistryWatcher:
    """The verified servers of one registry; see the module docstring.

    Args:
        uri: the registry (a folder or ``s3://bucket/prefix``).
        token: the job token the entries' proofs must match.
        poll_s: seconds between reads.
        timeout_s: the deadline of one read (default: 5 s, at least ``2 x poll_s``).
    """

    def __init__(self, uri: str, token: str, poll_s: float = 1.0, timeout_s: float | None = None) -> None:
        self.uri = check_uri(uri)
        self.token = token
        self.poll_s = float(poll_s)
        self.timeout_s = float(timeout_s) if timeout_s is not None else max(5.0, 2 * self.poll_s)
        self.fingerprint: str | None = None
        self.version = 0          # bumped whenever the set of usable servers changes
        self.reads = 0            # completed reads (failed ones included)
        self.error: str | None = None  # why the last read failed; None when it succeeded
        self._proved: dict[str, Entry] = {}  # address -> newest entry whose proof matches the token
        self._usable: dict[str, Entry] = {}
        self._logged: set[tuple] = set()
        self._cache: dict = {}  # entries by name: (version, bytes), so an S3 poll is one LIST
        self._refused: dict[tuple[str, str], str] = {}  # (address, server_id) -> why, found on connecting
        self._lock = threading.Lock()
        self._read_done = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._used = time.monotonic()
        self._reading_since: float | None = None  # a read in progress began then (a folder read cannot
        # be cut short: a hung network file system is noticed here and reported, not waited for)

    # -- what consumers see
    def set_fingerprint(self, fingerprint: str) -> None:
        """Use only servers of this pipeline fingerprint from now on (the job's pipeline)."""
        with self._lock:
            if fingerprint != self.fingerprint:
                self.fingerprint = fingerprint
                self._select()

    def snapshot(self) -> tuple[int, dict[str, Entry]]:
        """(version, address -> entry) of the usable servers; starts the polling thread if needed."""
        with self._lock:
            self._used = now = time.monotonic()
            since = self._reading_since
            if since is not None and now - since > self.timeout_s and self.error is None:
                self.error = f"a read has taken more than {self.timeout_s:g}s"
                log.warning("registry %s: a read has taken %.1fs (deadline %gs); carrying on with the %d data "
                            "server(s) known from it so far and any fixed ones", self.uri, now - since,
                            self.timeout_s, len(self._usable))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"registry {self.uri}", daemon=True)
                self._thread.start()
            return self.version, self._usable  # replaced, never changed in place: safe to hand out

    def refuse(self, address: str, server_id: str, reason: str) -> None:
        """Never use this entry again in this process (a consumer found it lying on connecting:
        another pipeline, or no token on the data plane); logged once."""
        with self._lock:
            if (address, server_id) in self._refused:
                return
            self._refused[(address, server_id)] = reason
            log.warning("registry %s: refused data server %s at %s: %s", self.uri, server_id, address, reason)
            self._select()

    def proved(self) -> list[Entry]:
        """Entries that prove the token, whatever their fingerprint, oldest first."""
        with self._lock:
            return sorted(self._proved.values(), key=lambda e: (e.started_at, e.server_id))

    def wait_read(self, after: int, timeout: float) -> bool:
        """Wait (up to ``timeout``) until more than ``after`` reads completed; True if so."""
        self.snapshot()
        end = time.monotonic() + timeout
        with self._lock:
            while self.reads <= after:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._read_done.wait(left)
            return True

    # -- polling
    def _run(self) -> None:
        while True:
            with self._lock:
                if time.monotonic() - self._used > IDLE_STOP_S:
                    self._thread = None
                    return
            started = self._reading_since = time.monotonic()
            try:
                self.poll()
            finally:
                self._reading_since = None
            time.sleep(max(0.0, self.poll_s - (time.monotonic() - started)))

    def poll(self) -> None:
        """Read the registry once and update the usable servers (the thread calls this)."""
        try:
            entries, refused = verified_entries(self.uri, self.token, None, timeout_s=self.timeout_s,
                                                cache=self._cache)
        except (RegistryError, OSError) as exc:
            with self._lock:
                if self.error is None:
                    log.warning("registry %s cannot be read (%s); carrying on with the %d data server(s) known "
                                "from it so far and any fixed ones", self.uri, exc, len(self._usable))
                self.error = str(exc)
                self.reads += 1
                self._read_done.notify_all()
            return
        for e, why in refused:
            if e is None:
                self._once(("corrupt", why), logging.WARNING, "registry %s: entry %s; it is not used", self.uri, why)
            else:
                self._once(("proof", e.server_id, e.address, e.proof), logging.WARNING,
                           "registry %s: refused data server %s at %s: %s", self.uri, e.server_id, e.address, why)
        proved = {e.address: e for e in entries}  # oldest first: the newest entry for an address wins
        with self._lock:
            if self.error is not None:
                log.info("registry %s can be read again (%d verified data server(s))", self.uri, len(proved))
            self.error = None
            self._proved = proved
            self._select()
            self.reads += 1
            self._read_done.notify_all()

    def _select(self) -> None:
        """Recompute the usable servers from the proved ones (lock held)."""
        usable = {}
        for address, e in self._proved.items():
            if (address, e.server_id) in self._refused:
                continue
            if self.fingerprint is not None:
                why = verify(e, self.token, self.fingerprint)
                if why is not None:
                    self._once(("fingerprint", e.server_id, e.fingerprint), logging.WARNING,
                               "registry %s: refused data server %s at %s: %s", self.uri, e.server_id,
                               e.address, why)
                    continue
            usable[address] = e
        if usable != self._usable:
            self._usable = usable
            self.version += 1

    def _once(self, key: tuple, level: int, msg: str, *args) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args)


_WATCHERS: dict[tuple, RegistryWatcher] = {}
_WATCHERS_LOCK = threading.Lock()


def watcher_for(uri: str, token: str, poll_s: float = 1.0) -> RegistryWatcher:
    """This process's watcher of ``uri`` for ``token`` (one per process, made on first use)."""
    key = (os.getpid(), uri, token, poll_s)
    with _WATCHERS_LOCK:
        w = _WATCHERS.get(key)
        if w is None:
            w = _WATCHERS[key] = RegistryWatcher(uri, token, poll_s)
        return w


def registered_servers(uri: str, token: str, fingerprint: str | None = None, timeout_s: float = 5.0) -> list[str]:
    """Addresses of the servers registered in ``uri`` that prove ``token`` (and run ``fingerprint``),
    read once; [] with a warning when the registry cannot be read."""
    try:
        entries, _ = verified_entries(uri, token, fingerprint, timeout_s=timeout_s)
    except (RegistryError, OSError) as exc:
        log.warning("registry %s cannot be read (%s); its servers are not listed", uri, exc)
        return []
    return sorted({e.address for e in entries})
