"""S3 as a store: ranged reads and uploads under ``s3://bucket/prefix`` that survive S3 as it really behaves.

``S3Store("s3://bucket/prefix")`` reads and writes objects under one prefix with boto3 (imported
lazily: the ``s3`` extra). Keys are relative to the prefix.

Endpoint. boto3 itself honours ``AWS_ENDPOINT_URL_S3`` and ``AWS_ENDPOINT_URL`` (and
``endpoint_url`` in the AWS config file); when any of them (or the ``endpoint_url`` argument)
points away from AWS, path-style addressing is used, which S3-compatible servers need
(``s3_client``).

Retries and deadlines (``s3_retry``). Every call is retried with exponential back-off and full
jitter, a GET together with the read of its body, within an overall deadline ``deadline_s``
(default ``request_timeout_s * attempts``); each request has botocore connect and read timeouts of
``request_timeout_s``, so a call returns or raises within about ``deadline_s + request_timeout_s``.

Errors. ``check()`` (called when a data server starts) raises ``ConfigError`` naming the bucket,
the key and the likely fix (``s3_errors``); so does ``list()``. Reads that fail for good raise
``StoreReadError``, writes ``StoreWriteError``, with the same messages.

Processes and threads. One boto3 client per process, made on first use and shared by the
process's threads (boto3 clients are thread-safe); a forked or spawned child makes its own
(``s3_client.ProcessClients``). A store pickles without its client. Counters, kept under a
lock: ``requests`` (every request sent, retries included), ``bytes_read`` (GET body bytes received,
those of attempts that broke off included), ``retries``.
"""
from __future__ import annotations

import builtins
import tempfile
from typing import Any

from ..errors import ConfigError
from . import s3_errors, s3_retry
from .base import StoreError, StoreReadError, StoreWriteError, removed_after
from .parsing import join_key, parse_s3_url
from .s3_client import ProcessClients, boto, endpoint_source, make_client


def _listed(page: dict, full_prefix: str, suffix: str, versions: bool, timed: bool = False) -> list[tuple]:
    """The entries of one LIST page as ``S3Store.list`` returns them: (key relative to
    ``full_prefix``, size), with the ETag third when ``versions``, and LastModified (Unix time)
    fourth when ``timed``, for keys ending with ``suffix``."""
    found = []
    for obj in page.get("Contents", []):
        rel = obj["Key"][len(full_prefix):]
        if not rel.endswith(suffix):
            continue
        row: tuple = (rel, int(obj["Size"]))
        if versions or timed:
            row += (str(obj.get("ETag", "")),)
        if timed:
            modified = obj.get("LastModified")
            row += (modified.timestamp() if hasattr(modified, "timestamp") else None,)
        found.append(row)
    return found


def _server_time(resp: dict) -> float | None:
    """The time S3 itself reported with a response (its Date header, Unix time), or None."""
    from email.utils import parsedate_to_datetime

    date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date).timestamp() if date else None
    except (TypeError, ValueError):
        return None


def _list_all(store: "S3Store", suffix: str, under: str, versions: bool,
              timed: bool = False) -> tuple[list[tuple], float | None]:
    """Every page of ``store``'s LIST under ``under`` (each retried), as ``_listed`` gives them,
    and the time S3 reported with the last page."""
    client = store._client()
    full_prefix = join_key(store.prefix, under)
    if full_prefix:
        full_prefix += "/"
    found: list[tuple] = []
    token: str | None = None
    while True:
        kw: dict[str, Any] = {"Bucket": store.bucket, "Prefix": full_prefix, "MaxKeys": store.list_page_size}
        if token:
            kw["ContinuationToken"] = token
        try:
            resp = store._call(lambda _, kw=kw: client.list_objects_v2(**kw), under, "listing", StoreReadError)
        except StoreReadError as e:  # listing happens at start: a set-up problem
            raise ConfigError(str(e)) from e
        found += _listed(resp, full_prefix, suffix, versions, timed)
        if not resp.get("IsTruncated"):
            return found, _server_time(resp)
        token = resp.get("NextContinuationToken")


class S3Store:
    """Objects under ``s3://bucket/prefix``: HEAD, ranged GET, LIST and uploads, retried.

    Args:
        url: ``s3://bucket/prefix`` (the prefix may be empty or end with "/").
        request_timeout_s: botocore's connect and read timeout for each request.
        attempts: tries per call (first try included).
        max_pool: HTTP connections kept per process (threads reading at once).
        client: a boto3 S3 client to use in this process instead of making one.
        deadline_s: the overall deadline of one call across its attempts (default
            ``request_timeout_s * attempts``).
        endpoint_url: an endpoint to use instead of boto3's (which honours AWS_ENDPOINT_URL_S3,
            AWS_ENDPOINT_URL and the config file).
        backoff_base_s, backoff_max_s: the exponential back-off with full jitter.
    """

    def __init__(self, url: str, *, request_timeout_s: float = 60.0, attempts: int = 8, max_pool: int = 16,
                 client: Any = None, deadline_s: float | None = None, endpoint_url: str | None = None,
                 backoff_base_s: float = 0.1, backoff_max_s: float = 10.0) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = url
        if request_timeout_s <= 0 or attempts < 1 or max_pool < 1:
            raise ConfigError(f"S3Store({url!r}): request_timeout_s must be > 0 (got {request_timeout_s}), "
                              f"attempts >= 1 (got {attempts}), max_pool >= 1 (got {max_pool})")
        self.request_timeout_s = float(request_timeout_s)
        self.attempts = int(attempts)
        self.max_pool = int(max_pool)
        self.deadline_s = float(deadline_s) if deadline_s is not None else self.request_timeout_s * self.attempts
        self.endpoint_url = endpoint_url
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.multipart_bytes = 64 << 20  # write_file: multipart above this, parts this big
        self.list_page_size = 1000  # list(): keys per LIST request
        self.requests = 0
        self.bytes_read = 0
        self.retries = 0
        self._clients = ProcessClients(client)

    # -- per-process state ---------------------------------------------------------------------
    def _count(self, requests: int = 0, bytes_read: int = 0, retries: int = 0) -> None:
        lock, _ = self._clients.mine()
        with lock:
            self.requests += requests
            self.bytes_read += bytes_read
            self.retries += retries

    def _client(self, writer: bool = False):
        return self._clients.get("writer" if writer else "reader", lambda: make_client(
            self.endpoint_url, self.request_timeout_s, self.max_pool, self.attempts, writer))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_clients"] = ProcessClients()
        return state

    def __repr__(self) -> str:
        return f"S3Store({self.url!r})"

    # -- public API -------------------------------------------------------------------------------
    def key_url(self, key: str) -> str:
        return f"s3://{self.bucket}/{join_key(self.prefix, key)}"

    def check(self, key: str) -> int:
        """HEAD ``key``: its size. Raises ConfigError naming the bucket, key and fix when the object
        cannot be read (no bucket, no key, access denied, no credentials, endpoint unreachable,
        or still failing after the retries). Call it when a data server starts."""
        try:
            return self._head(key)
        except StoreError as e:
            raise ConfigError(str(e)) from e

    def size(self, key: str) -> int:
        """The size of ``key`` in bytes (HEAD, retried)."""
        return self._head(key)

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (HEAD, retried; False on 404, also when the bucket is missing)."""
        try:
            self._head(key, missing_ok=True)
        except s3_retry.Missing:
            return False
        return True

    def read(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of ``key`` (end None: to the end) with one ranged GET, retried;
        exactly ``end - start`` bytes or StoreReadError."""
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"bad byte range [{start}, {end}) for {self.key_url(key)}")
        if end is not None and end == start:
            return b""
        client = self._client()
        kw: dict[str, Any] = {"Bucket": self.bucket, "Key": join_key(self.prefix, key)}
        if end is not None:
            kw["Range"] = f"bytes={start}-{end - 1}"
        elif start:
            kw["Range"] = f"bytes={start}-"

        def get(deadline: float) -> bytearray:
            return s3_retry.read_body(client.get_object(**kw), start, end, deadline, self._count)

        rng = f"bytes [{start}, {'end' if end is None else end})"
        return bytes(self._call(get, key, f"reading {rng} of", StoreReadError, rng=(start, end)))

    def list(self, suffix: str = "", under: str = "", versions: bool = False) -> list[tuple]:
        """(key relative to ``under`` under the prefix, size) of every object there whose key ends
        with ``suffix``, in key order (paginated LIST, each page retried); ``versions``: with its
        ETag third. Like ``check()``, called at start: raises ConfigError."""
        return _list_all(self, suffix, under, versions)[0]

    def list_timed(self, suffix: str = "", under: str = "") -> tuple[builtins.list[tuple], float | None]:
        """``(key, size, ETag, LastModified)`` as ``list(versions=True)`` with each object's
        LastModified (Unix time), and S3's own time now: the Date header of the last LIST response
        (None when the endpoint sends none). Both come from S3's clock, so comparing them needs
        no host's clock to be right (to within a second: both are whole seconds)."""
        return _list_all(self, suffix, under, True, timed=True)

    def write_bytes(self, key: str, data: bytes) -> None:
        """PUT ``data`` at ``key`` (retried)."""
        client = self._client(writer=True)
        self._call(lambda _: client.put_object(Bucket=self.bucket, Key=join_key(self.prefix, key), Body=data), key,
                   "writing", StoreWriteError)

    def write_file(self, key: str, path: str) -> None:
        """Upload the file at ``path`` to ``key`` (multipart above ``multipart_bytes``, 64 MB, parts
        in parallel; each request retried by botocore, the whole upload by this store)."""
        boto()
        from boto3.s3.transfer import TransferConfig
        client = self._client(writer=True)
        config = TransferConfig(multipart_threshold=self.multipart_bytes, multipart_chunksize=self.multipart_bytes,
                                max_concurrency=max(1, min(8, self.max_pool)), use_threads=True)
        self._call(lambda _: client.upload_file(path, self.bucket, join_key(self.prefix, key), Config=config), key,
                   "writing", StoreWriteError)

    def delete(self, key: str) -> None:
        """DELETE ``key`` (retried; nothing happens when it is not there)."""
        client = self._client(writer=True)
        self._call(lambda _: client.delete_object(Bucket=self.bucket, Key=join_key(self.prefix, key)), key,
                   "deleting", StoreWriteError)

    def staging(self):
        """A temporary local folder for files to upload with ``write_file`` (removed on exit)."""
        return removed_after(tempfile.mkdtemp(prefix="hetero-staging-"))

    def close(self) -> None:
        """Close this process's clients (their connection pools); the next call makes new ones."""
        self._clients.close()

    # -- internals --------------------------------------------------------------------------------
    def _head(self, key: str, missing_ok: bool = False) -> int:
        client = self._client()
        resp = self._call(lambda _: client.head_object(Bucket=self.bucket, Key=join_key(self.prefix, key)), key,
                          "reading", StoreReadError, missing_ok=missing_ok)
        return int(resp["ContentLength"])

    def _call(self, fn, key: str, doing: str, error: type[StoreError], *, missing_ok: bool = False,
              rng: tuple[int, int | None] | None = None):
        """``s3_retry.call`` for this store: each attempt ``fn(deadline)`` counted as a request, and its retries."""
        def attempt(deadline: float):
            self._count(requests=1)
            return fn(deadline)

        return s3_retry.call(self, attempt, key, doing, error, self._count, missing_ok=missing_ok, rng=rng)

    def endpoint_and_source(self) -> tuple[str, str]:
        """(the endpoint this process's client talks to, where it came from), for messages."""
        try:
            url = self._client().meta.endpoint_url
        except Exception:  # noqa: BLE001 - only for a message
            url = None
        return endpoint_source(self.endpoint_url, url)

    def region(self) -> str:
        """The client's region ("unset" when it has none), for messages."""
        try:
            return self._client().meta.region_name or "unset"
        except Exception:  # noqa: BLE001 - only for a message
            return "unset"

    def bucket_exists(self) -> bool:
        """Whether the bucket answers HEAD with anything but a clear 404 (for messages)."""
        self._count(requests=1)
        try:
            self._client().head_bucket(Bucket=self.bucket)
        except Exception as e:  # noqa: BLE001 - anything but a clear 404 counts as "exists"
            return s3_errors.error_code(e)[0] not in ("404", "NoSuchBucket", "NotFound")
        return True
