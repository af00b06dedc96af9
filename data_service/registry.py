"""The registry of a job's data servers: servers that join and leave a running job.

A registry lives at a URI that is a local folder or ``s3://bucket/prefix``. Each server that
joins writes one small JSON object, ``<uri>/servers/<server_id>.json``::

    {"address": "10.0.3.7:6000", "fingerprint": "<pipeline fingerprint>", "server_id": "...",
     "started_at": 1795000000.0, "proof": "<hex HMAC-SHA256(job token, 'server_id|address|fingerprint')>"}

and deletes it when it leaves. Consumers list the folder and use the servers whose proof matches
the job token and whose fingerprint is the job's pipeline (``verify``); anything else is refused.
The proof is checked before a consumer connects, so a consumer never sends the token to a server
that could not prove it knows the token. Entries are read as JSON only (nothing is unpickled).

Writes are atomic: a temporary file renamed into place in a folder, one PUT on S3. S3 requests
have a short deadline (``timeout_s``) and honour ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``
(``data_service.shards.s3``). A registry that cannot be read raises ``RegistryError``; an entry
that cannot be parsed is reported as a problem and skipped.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import time
from dataclasses import asdict, dataclass

from .errors import ConfigError, DataServiceError

SERVERS = "servers"  # the folder (key prefix) of the entries under the registry URI
MAX_ENTRY_BYTES = 64 << 10  # an entry larger than this is corrupt, not read
_SERVER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_FIELDS = ("address", "fingerprint", "server_id", "started_at", "proof")


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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def is_s3(uri: str) -> bool:
    return isinstance(uri, str) and uri.startswith("s3://")


def check_uri(uri: str, what: str = "registry") -> str:
    """``uri`` checked: an ``s3://bucket/prefix`` URL or a folder path.

    Raises:
        ConfigError: empty, or an S3 URL without a valid bucket.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"{what}={uri!r} must be a folder or s3://bucket/prefix")
    uri = uri.strip()
    if is_s3(uri):
        from .shards.s3 import parse_s3_url

        parse_s3_url(uri)
    elif "://" in uri:
        raise ConfigError(f"{what}={uri!r}: only a local folder or s3://bucket/prefix is supported")
    return uri


def make_proof(token: str, server_id: str, address: str, fingerprint: str) -> str:
    """Hex HMAC-SHA256 of ``server_id|address|fingerprint`` keyed with the job token."""
    message = f"{server_id}|{address}|{fingerprint}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def make_entry(token: str, server_id: str, address: str, fingerprint: str,
               started_at: float | None = None) -> Entry:
    """An entry for one server, with its proof of ``token``.

    Raises:
        ConfigError: no token, a server id unfit for a file name, or an address not ``host:port``.
    """
    if not token:
        raise ConfigError("token='' : registering a data server needs the job token")
    if not _SERVER_ID.match(server_id or ""):
        raise ConfigError(f"server_id={server_id!r} must be 1-200 letters, digits, '.', '_' or '-' "
                          "(it names the registry entry's file)")
    host, sep, port = (address or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"address={address!r} must look like 'host:port' (the address consumers dial)")
    return Entry(address, fingerprint, server_id, float(time.time() if started_at is None else started_at),
                 make_proof(token, server_id, address, fingerprint))


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
    return Entry(obj["address"], obj["fingerprint"], obj["server_id"], float(obj["started_at"]), obj["proof"])


def register(uri: str, token: str, server_id: str, address: str, fingerprint: str, *,
             timeout_s: float = 10.0, started_at: float | None = None) -> Entry:
    """Write this server's entry (atomically); returns it. ``started_at``: when the server was
    made (Unix time; default now).

    Raises:
        ConfigError: bad arguments (see ``make_entry``). RegistryError: the write failed.
    """
    entry = make_entry(token, server_id, address, fingerprint, started_at)
    _write(check_uri(uri), f"{server_id}.json", entry.to_json(), timeout_s)
    return entry


def unregister(uri: str, server_id: str, *, timeout_s: float = 10.0) -> None:
    """Delete this server's entry (nothing happens when it is not there).

    Raises:
        RegistryError: the delete failed.
    """
    uri = check_uri(uri)
    name = f"{server_id}.json"
    if is_s3(uri):
        from .shards.s3 import S3Error

        try:
            _store(uri, timeout_s).delete(f"{SERVERS}/{name}")
        except (S3Error, ConfigError) as exc:
            raise RegistryError(f"cannot remove {uri}/{SERVERS}/{name}: {exc}") from exc
        return
    try:
        os.unlink(os.path.join(uri, SERVERS, name))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise RegistryError(f"cannot remove {os.path.join(uri, SERVERS, name)}: {exc}") from exc


def read_entries(uri: str, *, timeout_s: float = 5.0, cache: dict | None = None) -> tuple[list[Entry], list[str]]:
    """Every entry of the registry, and a line per entry that could not be read (corrupt).

    A registry folder with no ``servers`` folder yet has no entries. ``cache``: a dict the caller
    keeps between reads of an S3 registry; an object listed with the name and size it had at the
    last read is not fetched again (a poll is then one LIST).

    Raises:
        RegistryError: the registry cannot be listed (unreachable, no such folder, permissions).
    """
    uri = check_uri(uri)
    entries: list[Entry] = []
    problems: list[str] = []
    for name, data in (_read_s3(uri, timeout_s, cache) if is_s3(uri) else _read_folder(uri)):
        if isinstance(data, str):
            problems.append(f"{name}: {data}")
            continue
        try:
            entries.append(parse_entry(data, name))
        except ValueError as exc:
            problems.append(str(exc))
    return entries, problems


def _read_folder(uri: str):
    folder = os.path.join(uri, SERVERS)
    if not os.path.isdir(uri):
        raise RegistryError(f"registry folder {uri} does not exist (or is not a folder)")
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RegistryError(f"cannot list {folder}: {exc}") from exc
    out = []
    for name in names:
        try:
            with open(os.path.join(folder, name), "rb") as f:
                out.append((name, f.read(MAX_ENTRY_BYTES + 1)))
        except FileNotFoundError:
            continue  # removed meanwhile: the server left
        except OSError as exc:
            out.append((name, f"cannot be read ({exc})"))
    return out


_STORES: dict[tuple[str, float], object] = {}


def _store(uri: str, timeout_s: float):
    """One S3Store per registry and deadline in this process (its client is made per process)."""
    from .shards.s3 import S3Store

    key = (uri, timeout_s)
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = S3Store(uri, request_timeout_s=max(0.5, timeout_s / 2), attempts=2,
                                       deadline_s=timeout_s, backoff_max_s=0.5)
    return store


def _read_s3(uri: str, timeout_s: float, cache: dict | None):
    from .shards.s3 import S3Error

    store = _store(uri, timeout_s)
    try:
        listed = store.list(".json")
    except (S3Error, ConfigError) as exc:
        raise RegistryError(f"cannot list {uri}/{SERVERS}: {exc}") from exc
    if cache is not None:
        for gone in set(cache) - {key for key, _ in listed}:
            del cache[gone]
    out = []
    for key, size in listed:
        folder, _, name = key.rpartition("/")
        if folder != SERVERS or name.startswith("."):
            continue
        if size > MAX_ENTRY_BYTES:
            out.append((name, f"{size} bytes, more than an entry can be ({MAX_ENTRY_BYTES})"))
            continue
        if cache is not None and key in cache and cache[key][0] == size:
            out.append((name, cache[key][1]))
            continue
        try:
            data = store.read(key)
            out.append((name, data))
            if cache is not None:
                cache[key] = (size, data)
        except S3Error as exc:
            if getattr(exc, "code", "") in ("NoSuchKey", "404", "NotFound"):
                continue  # removed between the listing and the read
            raise RegistryError(f"cannot read {uri}/{key}: {exc}") from exc
    return out


def _write(uri: str, name: str, data: bytes, timeout_s: float) -> None:
    if is_s3(uri):
        from .shards.s3 import S3Error

        try:
            _store(uri, timeout_s).write_bytes(f"{SERVERS}/{name}", data)  # one PUT: atomic
        except (S3Error, ConfigError) as exc:
            raise RegistryError(f"cannot write {uri}/{SERVERS}/{name}: {exc}") from exc
        return
    folder = os.path.join(uri, SERVERS)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(folder, name))  # readers see the old entry or the new, never half
    except OSError as exc:
        raise RegistryError(f"cannot write {os.path.join(folder, name)}: {exc}; check the registry folder "
                            "exists and is writable") from exc
