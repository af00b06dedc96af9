"""The registry of a job's data servers: servers that join and leave a running job.

A registry lives at a URI that is a local folder or ``s3://bucket/prefix``. Each server that
joins writes one small JSON object, ``<uri>/servers/<server_id>.json``::

    {"address": "10.0.3.7:6000", "fingerprint": "<pipeline fingerprint>", "server_id": "...",
     "started_at": 1795000000.0, "proof": "<hex HMAC-SHA256(job token, 'server_id|address|fingerprint')>",
     "refreshed_at": 1795000030.0, "ttl_s": 15.0}

and deletes it when it leaves. A server with a heartbeat (``Heartbeat``, ``data_service.membership.joining``)
rewrites its entry every third of ``ttl_s``; an entry not refreshed for ``ttl_s`` seconds
(``expired``: the server was killed, or its host is gone) is refused by every reader, so a
server killed with -9 drops out of the job within the TTL and one poll. An entry without
``ttl_s`` (or 0) never expires. An entry's age is judged on the store's clock, never a host's
(``Store.list_timed``): on S3 its LastModified against the Date S3 sends with the LIST; in a
folder its mtime against that of a probe file touched on the same file system. A writer or
reader whose clock is off by an hour thus still sees exactly the live servers. Only where the
store cannot tell its time (a read-only folder, an endpoint without a Date header) is the
reader's clock used instead. ``refreshed_at`` is written for people reading the entry.

Consumers list the folder and use the servers whose proof matches the job token and whose
fingerprint is the job's pipeline (``verify``); anything else is refused. The proof is checked
before a consumer connects, so a consumer never sends the token to a server that could not prove
it knows the token. Entries are read as JSON only (nothing is unpickled).

Entries go through ``data_service.storage``: writes are atomic (a temporary file renamed into
place in a folder, one PUT on S3); S3 requests have a short deadline (``timeout_s``) and honour
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``. A registry that cannot be read raises
``RegistryError``; an entry that cannot be parsed is reported as a problem and skipped.
``verified_entries`` is the one reader of what a registry holds for a job (the consumers' watcher
and rank 0's advisor use it).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from dataclasses import asdict, dataclass

from ..protocol.addresses import split_address
from ..errors import ConfigError, DataServiceError
from ..storage import Store, StoreError, check_location, open_store

SERVERS = "servers"  # the folder (key prefix) of the entries under the registry URI
MAX_ENTRY_BYTES = 64 << 10  # an entry larger than this is corrupt, not read
_SERVER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_FIELDS = ("address", "fingerprint", "server_id", "started_at", "proof")
DEFAULT_TTL_S = 15.0  # a joined server's entry expires this long after its last refresh


class RegistryError(DataServiceError):
    """The registry could not be read or written (unreachable, no such folder, permissions)."""


@dataclass(frozen=True)
class Entry:
    """One registered data server (the JSON object's fields)."""

    address: str
    fingerprint: str
    server_id: str
    started_at: float
    proof: str
    refreshed_at: float = 0.0  # the writer's Unix time of the last heartbeat (0: never refreshed); shown only
    ttl_s: float = 0.0         # the entry expires ttl_s after its last write, on the store's clock (0: never)

    def expired(self, age_s: float) -> bool:
        """True when the entry has a TTL and its object, last written ``age_s`` seconds ago (on
        the store's clock), was not rewritten within it."""
        return self.ttl_s > 0 and age_s > self.ttl_s

    def to_json(self) -> bytes:
        obj = asdict(self)
        if not self.ttl_s:  # an entry that never expires is written as one without a heartbeat
            del obj["refreshed_at"], obj["ttl_s"]
        return json.dumps(obj, sort_keys=True).encode()


def check_uri(uri: str, what: str = "registry") -> str:
    """``uri`` checked: an ``s3://bucket/prefix`` URL or a folder path.

    Raises:
        ConfigError: empty, another scheme, or an S3 URL without a valid bucket.
    """
    return check_location(uri, what)


def make_proof(token: str, server_id: str, address: str, fingerprint: str) -> str:
    """Hex HMAC-SHA256 of ``server_id|address|fingerprint`` keyed with the job token."""
    return hmac.new(token.encode(), f"{server_id}|{address}|{fingerprint}".encode(), hashlib.sha256).hexdigest()


def make_entry(token: str, server_id: str, address: str, fingerprint: str,
               started_at: float | None = None, ttl_s: float = 0.0) -> Entry:
    """An entry for one server, with its proof of ``token``, refreshed now, expiring ``ttl_s``
    seconds after its last refresh (0: never).

    Raises:
        ConfigError: no token, a server id unfit for a file name, an address not ``host:port``,
        or a negative TTL.
    """
    if not (isinstance(ttl_s, (int, float)) and 0 <= ttl_s < float("inf")):
        raise ConfigError(f"ttl_s={ttl_s!r} must be >= 0 seconds (0: the entry never expires)")
    if not token:
        raise ConfigError("token='' : registering a data server needs the job token")
    if not _SERVER_ID.match(server_id or ""):
        raise ConfigError(f"server_id={server_id!r} must be 1-200 letters, digits, '.', '_' or '-' "
                          "(it names the registry entry's file)")
    split_address(address, "registry entry address (the address consumers dial)")
    now = time.time()
    return Entry(address, fingerprint, server_id, float(now if started_at is None else started_at),
                 make_proof(token, server_id, address, fingerprint), now if ttl_s else 0.0, float(ttl_s))


def verify(entry: Entry, token: str, fingerprint: str | None) -> str | None:
    """None when ``entry`` proves ``token`` and serves ``fingerprint`` (None: any), else the reason."""
    expected = make_proof(token, entry.server_id, entry.address, entry.fingerprint)
    if not hmac.compare_digest(expected, entry.proof):
        return "its proof does not match the job token (a server of another job, or a forged entry)"
    if fingerprint is not None and entry.fingerprint != fingerprint:
        return (f"it serves pipeline fingerprint {entry.fingerprint}, the job runs {fingerprint} "
                "(another pipeline or other pipeline options)")
    return None


def parse_entry(data: bytes, name: str) -> Entry:
    """An entry from its JSON bytes; ValueError naming ``name`` and what is wrong."""
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError(f"{name}: {len(data)} bytes, more than an entry can be ({MAX_ENTRY_BYTES})")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{name}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{name}: not a JSON object")
    missing = [f for f in _FIELDS if f not in obj]
    if missing:
        raise ValueError(f"{name}: lacks {missing}")
    strings = [f for f in ("address", "fingerprint", "server_id", "proof") if not isinstance(obj[f], str)]
    if strings or not isinstance(obj["started_at"], (int, float)) or isinstance(obj["started_at"], bool):
        raise ValueError(f"{name}: fields of the wrong type ({strings or ['started_at']})")
    times = {}
    for f in ("refreshed_at", "ttl_s"):  # optional: entries of servers without a heartbeat lack them
        v = obj.get(f, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
            raise ValueError(f"{name}: {f}={v!r} is not a number of seconds >= 0")
        times[f] = float(v)
    return Entry(obj["address"], obj["fingerprint"], obj["server_id"], float(obj["started_at"]), obj["proof"],
                 **times)


def register(uri: str, token: str, server_id: str, address: str, fingerprint: str, *,
             timeout_s: float = 10.0, started_at: float | None = None, ttl_s: float = 0.0) -> Entry:
    """Write this server's entry (atomically), refreshed now; returns it. ``started_at``: when the
    server was made (Unix time; default now). ``ttl_s``: the entry expires that long after its last
    write (0: never); writing it again (the same arguments) is the heartbeat.

    Raises:
        ConfigError: bad arguments (see ``make_entry``). RegistryError: the write failed.
    """
    entry = make_entry(token, server_id, address, fingerprint, started_at, ttl_s)
    store = _store(check_uri(uri), timeout_s, create=True)
    key = f"{SERVERS}/{server_id}.json"
    try:
        store.write_bytes(key, entry.to_json())
    except (StoreError, ConfigError) as exc:
        raise RegistryError(f"cannot write {store.key_url(key)}: {exc}") from exc
    return entry


def unregister(uri: str, server_id: str, *, timeout_s: float = 10.0) -> None:
    """Delete this server's entry (nothing happens when it is not there).

    Raises:
        RegistryError: the delete failed.
    """
    store = _store(check_uri(uri), timeout_s)
    key = f"{SERVERS}/{server_id}.json"
    try:
        store.delete(key)
    except (StoreError, ConfigError) as exc:
        raise RegistryError(f"cannot remove {store.key_url(key)}: {exc}") from exc


def read_entries(uri: str, *, timeout_s: float = 5.0, cache: dict | None = None) -> tuple[list[Entry], list[str]]:
    """Every entry of the registry, and a line per entry that could not be read (corrupt).

    A registry with no ``servers`` folder yet has no entries. ``cache``: a dict the caller keeps
    between reads; an entry listed with the version (S3 ETag, a file's inode and mtime) it had at
    the last read is not fetched again (an S3 poll is then one LIST).

    Raises:
        RegistryError: the registry cannot be listed (unreachable, no such folder, permissions).
    """
    aged, problems = _read(uri, timeout_s, cache)
    return [e for e, _ in aged], problems


def _read(uri: str, timeout_s: float, cache: dict | None) -> tuple[list[tuple[Entry, float]], list[str]]:
    """``read_entries`` with each entry's age (seconds since its object was written, on the store's clock)."""
    store = _store(check_uri(uri), timeout_s)
    try:
        listed, store_now = store.list_timed(".json", under=SERVERS)
    except (StoreError, ConfigError) as exc:
        raise RegistryError(f"cannot list {store.key_url(SERVERS)}: {exc}") from exc
    if store_now is None:  # the store cannot tell its time: the reader's clock is all there is
        store_now = time.time()
    if cache is not None:
        for gone in set(cache) - {row[0] for row in listed}:
            del cache[gone]
    aged: list[tuple[Entry, float]] = []
    problems: list[str] = []
    for name, size, version, modified in listed:
        if "/" in name or name.startswith("."):
            continue
        data = _entry_bytes(store, name, size, version, cache)
        if data is None:
            continue  # removed between the listing and the read: the server left
        if isinstance(data, str):
            problems.append(f"{name}: {data}")
            continue
        try:
            entry = parse_entry(data, name)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        # whole seconds on S3 can put a write just after the Date: an age below 0 is 0
        aged.append((entry, max(0.0, store_now - modified) if modified is not None else 0.0))
    return aged, problems


def verified_entries(uri: str, token: str, fingerprint: str | None = None, *, timeout_s: float = 5.0,
                     cache: dict | None = None) -> tuple[list[Entry], list[tuple[Entry | None, str]]]:
    """The entries of ``uri`` that prove ``token`` (and serve ``fingerprint``; None: any) and have
    not expired (their age judged on the store's clock), oldest first, and what was refused:
    ``(entry, why)``, the entry None for one that cannot be parsed.

    Raises:
        RegistryError: the registry cannot be listed.
    """
    aged, problems = _read(uri, timeout_s, cache)
    refused: list[tuple[Entry | None, str]] = [(None, p) for p in problems]
    good = []
    for e, age in sorted(aged, key=lambda ea: (ea[0].started_at, ea[0].server_id)):
        why = verify(e, token, fingerprint)
        if why is None and e.expired(age):
            why = (f"its entry expired: last written {age:.1f} s ago by the registry's clock, its TTL is "
                   f"{e.ttl_s:g} s (the server stopped without leaving, or cannot reach the registry)")
        if why is None:
            good.append(e)
        else:
            refused.append((e, why))
    return good, refused


def _entry_bytes(store: Store, name: str, size: int, version: str, cache: dict | None) -> bytes | str | None:
    """The bytes of entry ``name`` (from ``cache`` when its version is unchanged), a line saying why
    it cannot be read, or None when it is gone."""
    if size > MAX_ENTRY_BYTES:
        return f"{size} bytes, more than an entry can be ({MAX_ENTRY_BYTES})"
    if cache is not None and name in cache and cache[name][0] == version:
        return cache[name][1]
    key = f"{SERVERS}/{name}"
    try:
        data = store.read(key)
    except StoreError as exc:
        if exc.missing:
            return None
        raise RegistryError(f"cannot read {store.key_url(key)}: {exc}") from exc
    if cache is not None:
        cache[name] = (version, data)
    return data


_STORES: dict[tuple[str, float, bool], Store] = {}


def _store(uri: str, timeout_s: float, create: bool = False) -> Store:
    """One store per registry and deadline in this process (an S3 client is made per process)."""
    key = (uri, timeout_s, create)
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = open_store(uri, what="registry", create=create,
                                          request_timeout_s=max(0.5, timeout_s / 2), attempts=2,
                                          deadline_s=timeout_s, backoff_max_s=0.5)
    return store
