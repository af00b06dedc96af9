"""S3 access for shards and their index: ranged reads that survive S3 as it really behaves.

``S3Store("s3://bucket/prefix")`` reads and writes objects under one prefix with boto3 (imported
lazily: ``pip install 'hetero-data-service[s3]'``). Keys are relative to the prefix.

Endpoint. boto3 itself honours ``AWS_ENDPOINT_URL_S3`` and ``AWS_ENDPOINT_URL`` (and
``endpoint_url`` in the AWS config file); when any of them (or the ``endpoint_url`` argument)
points away from AWS, path-style addressing is used, which S3-compatible servers need.

Retries. botocore's own retries are off for reads: every GET is retried here, together with the
read of its body, because botocore never retries a body that breaks off (a reset, a stall, fewer
bytes than Content-Length). Retried: 500, 502, 503 (SlowDown), 504, throttling codes, connection
errors and resets, connect and read timeouts, short bodies. Not retried: 400, 403, 404
(NoSuchKey, NoSuchBucket), 416, missing credentials. Back-off is exponential with full jitter
(``uniform(0, min(backoff_max_s, backoff_base_s * 2**n))``). ``retries`` counts every retry.
Writes (converters only) keep botocore's standard retries too, so one failed part of a multipart
upload is sent again alone; the store then retries the whole call.

Deadlines. Each request has botocore connect and read timeouts of ``request_timeout_s`` (the read
timeout bounds any silence, so a body that stalls after its headers fails after that long), and
each call has an overall deadline ``deadline_s`` (default ``request_timeout_s * attempts``)
across its attempts and back-off sleeps: no attempt starts or sleeps past it, and a body still
trickling in is abandoned at it (checked every 256 KB), so a call returns or raises within about
``deadline_s + request_timeout_s``.

Errors. ``check()`` (called when a data server starts) raises ``ConfigError`` naming the bucket,
the key and the likely fix: no such bucket, no such key, access denied, no credentials, an
endpoint that cannot be reached (and the variable it came from); so does ``list()``. Reads
that fail for good raise ``S3ReadError``, writes ``S3WriteError``, with the same messages.

Processes and threads. One boto3 client per process, made on first use and shared by the
process's threads (boto3 clients are thread-safe); a forked or spawned child makes its own. A
store pickles without its client. Counters, kept under a lock: ``requests`` (every request sent,
retries included), ``bytes_read`` (GET body bytes received, those of attempts that broke off
included), ``retries``.
"""
from __future__ import annotations

import os
import random
import re
import threading
import time
from typing import Any

from data_service.errors import ConfigError, DataServiceError

INSTALL_HINT = "pip install 'hetero-data-service[s3]'"

_CHUNK = 256 << 10  # body bytes read per call, between deadline checks
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
_RETRY_STATUS = {500, 502, 503, 504, 429}
_RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
                "RequestLimitExceeded", "TooManyRequestsException", "RequestTimeout", "RequestTimeoutException",
                "InternalError", "ServiceUnavailable", "BandwidthLimitExceeded", "PriorRequestNotComplete",
                "EC2ThrottledException"}
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_DENIED = {"403", "AccessDenied", "Forbidden", "AllAccessDisabled", "AccountProblem"}
_BAD_KEYS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "TokenRefreshRequired"}
_WRONG_REGION = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301"}
_RANGE = {"416", "InvalidRange"}

_STATE_LOCK = threading.Lock()  # guards making a process's lock and clients; fresh in a forked child
os.register_at_fork(after_in_child=lambda: globals().__setitem__("_STATE_LOCK", threading.Lock()))


class S3Error(DataServiceError):
    """An S3 call failed for good (after its retries, or at once when retrying cannot help)."""

    def __init__(self, message: str, *, bucket: str = "", key: str = "", code: str = "",
                 retryable: bool = False) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.key = key
        self.code = code
        self.retryable = retryable  # True: transient failures outlasted the retries / deadline


class S3ReadError(S3Error):
    """Reading (GET, HEAD, LIST) an object failed for good."""


class S3WriteError(S3Error):
    """Writing an object failed for good."""


class _ShortRead(Exception):
    """The body ended (or the server announced) fewer bytes than the range asked for."""


class _DeadlineExceeded(Exception):
    """The call's overall deadline passed while a body was still arriving."""


def is_s3_url(value: str) -> bool:
    """Whether ``value`` is a string of the form ``s3://...``."""
    return isinstance(value, str) and value.startswith("s3://")


def parse_s3_url(url: str) -> tuple[str, str]:
    """``"s3://bucket/a/b"`` -> ``("bucket", "a/b")``; ``"s3://bucket"`` -> ``("bucket", "")``."""
    if not is_s3_url(url):
        raise ConfigError(f"{url!r} is not an S3 URL: expected s3://bucket/prefix")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not _BUCKET_RE.match(bucket):
        raise ConfigError(f"{url!r} does not name a valid bucket ({bucket!r}): expected s3://bucket/prefix, "
                          f"the bucket 3-63 letters, digits, dots or hyphens")
    return bucket, prefix


def _join(prefix: str, key: str) -> str:
    key = key.lstrip("/")
    prefix = prefix.rstrip("/")
    if not prefix:
        return key
    return f"{prefix}/{key}" if key else prefix


def _boto():
    try:
        import boto3
        import botocore.config
    except ImportError as e:
        raise ConfigError(f"reading or writing s3:// URLs needs boto3, which is not installed: {INSTALL_HINT}") from e
    return boto3, botocore.config


def _is_aws_host(url: str | None) -> bool:
    host = (url or "").split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0].lower()
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn", ".api.aws"))


def _error_code(e: BaseException) -> tuple[str, int | None]:
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return "", None
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status


def _root_cause(e: BaseException) -> BaseException:
    """boto3's S3UploadFailedError hides the ClientError it came from in __context__."""
    if type(e).__name__ == "S3UploadFailedError" and e.__context__ is not None:
        return e.__context__
    return e


def _retryable(e: BaseException) -> bool | None:
    """True: retry. False: fail at once. None: not an S3/transport error (let it through)."""
    import botocore.exceptions as bx

    e = _root_cause(e)
    if isinstance(e, (_ShortRead,)):
        return True
    if isinstance(e, bx.ClientError):
        code, status = _error_code(e)
        return status in _RETRY_STATUS or code in _RETRY_CODES
    if isinstance(e, bx.FlexibleChecksumError):
        return True  # the body was damaged on the way
    if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.ParamValidationError)):
        return False
    if isinstance(e, (bx.HTTPClientError, bx.ConnectionError, bx.IncompleteReadError, bx.ReadTimeoutError)):
        return True  # connection errors, resets, connect/read timeouts, broken bodies
    if isinstance(e, bx.CredentialRetrievalError):
        return False
    if isinstance(e, bx.BotoCoreError):
        return False
    try:
        import urllib3.exceptions as ux
        if isinstance(e, ux.HTTPError):
            return True
    except ImportError:  # pragma: no cover - botocore depends on urllib3
        pass
    import http.client
    if isinstance(e, (ConnectionError, TimeoutError, http.client.HTTPException)):
        return True  # socket-level resets and timeouts; other OSErrors (a missing local file) are not S3's
    return None


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
        self._given = (os.getpid(), client) if client is not None else None
        self._local: tuple[int, threading.Lock, dict] | None = None

    # -- per-process state ---------------------------------------------------------------------
    def _proc(self) -> tuple[threading.Lock, dict]:
        """This process's lock and clients (a child after fork gets fresh ones, never the parent's)."""
        local = self._local
        pid = os.getpid()
        if local is None or local[0] != pid:
            with _STATE_LOCK:
                local = self._local
                if local is None or local[0] != pid:
                    local = (pid, threading.Lock(), {})
                    self._local = local
        return local[1], local[2]

    def _count(self, requests: int = 0, bytes_read: int = 0, retries: int = 0) -> None:
        lock, _ = self._proc()
        with lock:
            self.requests += requests
            self.bytes_read += bytes_read
            self.retries += retries

    def _client(self, writer: bool = False):
        lock, clients = self._proc()
        name = "writer" if writer else "reader"
        c = clients.get(name)
        if c is not None:
            return c
        with lock:  # one client per process: threads wait for the first one to make it
            c = clients.get(name)
            if c is None:
                if self._given is not None and self._given[0] == os.getpid():
                    c = self._given[1]
                else:
                    c = self._make_client(writer)
                clients[name] = c
            return c

    def _configured_endpoint(self) -> tuple[str | None, str]:
        """(the endpoint asked for, where it came from); (None, "") when boto3 picks AWS's."""
        if self.endpoint_url:
            return self.endpoint_url, "the endpoint_url argument"
        if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
            return None, ""
        for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if os.environ.get(var):
                return os.environ[var], var
        return None, ""

    def _make_client(self, writer: bool):
        boto3, bconfig = _boto()
        configured, _ = self._configured_endpoint()

        def make(path_style: bool):
            config = bconfig.Config(
                connect_timeout=self.request_timeout_s, read_timeout=self.request_timeout_s,
                max_pool_connections=self.max_pool, tcp_keepalive=True,
                # reads: every retry is ours (with the body read); writes: botocore retries each
                # request (each multipart part) too, and ours retries the whole upload
                retries={"mode": "standard", "total_max_attempts": self.attempts if writer else 1},
                s3={"addressing_style": "path"} if path_style else None)
            return boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, config=config)

        client = make(configured is not None)
        if configured is None and not _is_aws_host(client.meta.endpoint_url):
            client = make(True)  # an endpoint from the AWS config file: not AWS, so path-style
        return client

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_local"] = None
        state["_given"] = None
        return state

    def __repr__(self) -> str:
        return f"S3Store({self.url!r})"

    # -- public API -------------------------------------------------------------------------------
    def key_url(self, key: str) -> str:
        return f"s3://{self.bucket}/{_join(self.prefix, key)}"

    @property
    def endpoint(self) -> str:
        """The endpoint this process's client talks to, and where it came from."""
        url, source = self._endpoint_and_source()
        return f"{url} (from {source})"

    def check(self, key: str) -> int:
        """HEAD ``key``: its size. Raises ConfigError naming the bucket, key and fix when the object
        cannot be read (no bucket, no key, access denied, no credentials, endpoint unreachable,
        or still failing after the retries). Call it when a data server starts."""
        try:
            return self._head(key)
        except S3Error as e:
            raise ConfigError(str(e)) from e

    def size(self, key: str) -> int:
        """The size of ``key`` in bytes (HEAD, retried)."""
        return self._head(key)

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (HEAD, retried; False on 404, also when the bucket is missing)."""
        try:
            self._head(key, missing_ok=True)
        except _Missing:
            return False
        return True

    def read(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of ``key`` (end None: to the end) with one ranged GET, retried;
        exactly ``end - start`` bytes or S3ReadError."""
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"bad byte range [{start}, {end}) for {self.key_url(key)}")
        if end is not None and end == start:
            return b""
        holder: list[bytearray] = []

        def alloc(n: int) -> memoryview:
            holder[:] = [bytearray(n)]
            return memoryview(holder[0])

        self._get(key, start, end, alloc)
        return bytes(holder[0])

    def read_into(self, key: str, start: int, end: int | None, out: memoryview) -> None:
        """Bytes [start, end) of ``key`` into ``out[:end - start]`` (end None: ``start + len(out)``)."""
        out = memoryview(out).cast("B")
        if end is None:
            end = start + len(out)
        if start < 0 or end < start or len(out) < end - start:
            raise ValueError(f"bad byte range [{start}, {end}) for {self.key_url(key)} "
                             f"into a buffer of {len(out)} bytes")
        if end == start:
            return

        def alloc(n: int) -> memoryview:
            return out[:n]

        self._get(key, start, end, alloc)

    def list(self, suffix: str = "") -> list[tuple[str, int]]:
        """(key relative to the prefix, size) of every object under the prefix whose key ends with
        ``suffix``, in key order (paginated LIST, each page retried). Like ``check()``, called at
        start: raises ConfigError."""
        client = self._client()
        full_prefix = _join(self.prefix, "")
        if full_prefix:
            full_prefix += "/"
        found: list[tuple[str, int]] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full_prefix, "MaxKeys": self.list_page_size}
            if token:
                kw["ContinuationToken"] = token

            def page(deadline: float, kw=kw):
                self._count(requests=1)
                return client.list_objects_v2(**kw)

            try:
                resp = self._call(page, "", "listing", S3ReadError)
            except S3ReadError as e:  # listing happens at start: a set-up problem
                raise ConfigError(str(e)) from e
            for obj in resp.get("Contents", []):
                rel = obj["Key"][len(full_prefix):]
                if rel.endswith(suffix):
                    found.append((rel, int(obj["Size"])))
            if not resp.get("IsTruncated"):
                return found
            token = resp.get("NextContinuationToken")

    def write_bytes(self, key: str, data: bytes) -> None:
        """PUT ``data`` at ``key`` (retried)."""
        client = self._client(writer=True)

        def put(deadline: float):
            self._count(requests=1)
            client.put_object(Bucket=self.bucket, Key=_join(self.prefix, key), Body=data)

        self._call(put, key, "writing", S3WriteError)

    def write_file(self, key: str, path: str) -> None:
        """Upload the file at ``path`` to ``key`` (multipart above ``multipart_bytes``, 64 MB, parts
        in parallel; each request retried by botocore, the whole upload by this store)."""
        _boto()
        from boto3.s3.transfer import TransferConfig
        client = self._client(writer=True)
        config = TransferConfig(multipart_threshold=self.multipart_bytes, multipart_chunksize=self.multipart_bytes,
                                max_concurrency=max(1, min(8, self.max_pool)), use_threads=True)

        def upload(deadline: float):
            self._count(requests=1)
            client.upload_file(path, self.bucket, _join(self.prefix, key), Config=config)

        self._call(upload, key, "writing", S3WriteError)

    def delete(self, key: str) -> None:
        """DELETE ``key`` (retried; nothing happens when it is not there)."""
        client = self._client(writer=True)

        def delete(deadline: float):
            self._count(requests=1)
            client.delete_object(Bucket=self.bucket, Key=_join(self.prefix, key))

        self._call(delete, key, "deleting", S3WriteError)

    def close(self) -> None:
        """Close this process's clients (their connection pools); the next call makes new ones."""
        lock, clients = self._proc()
        with lock:
            made = [c for c in clients.values() if self._given is None or c is not self._given[1]]
            clients.clear()
        for c in {id(c): c for c in made}.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    # -- internals --------------------------------------------------------------------------------
    def _head(self, key: str, missing_ok: bool = False) -> int:
        client = self._client()

        def head(deadline: float) -> int:
            self._count(requests=1)
            return int(client.head_object(Bucket=self.bucket, Key=_join(self.prefix, key))["ContentLength"])

        return self._call(head, key, "reading", S3ReadError, missing_ok=missing_ok)

    def _get(self, key: str, start: int, end: int | None, alloc) -> None:
        client = self._client()
        full = _join(self.prefix, key)
        kw: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
        if end is not None:
            kw["Range"] = f"bytes={start}-{end - 1}"
        elif start:
            kw["Range"] = f"bytes={start}-"

        def get(deadline: float) -> None:
            self._count(requests=1)
            resp = client.get_object(**kw)
            body = resp["Body"]
            done = False
            try:
                length = int(resp["ContentLength"])
                want = end - start if end is not None else length
                if length != want:
                    total = _range_total(resp.get("ContentRange"))
                    if total is not None and end is not None and end > total:
                        raise _OutOfRange(total)
                    raise _ShortRead(f"the server announced {length} bytes for a range of {want}")
                out = alloc(want)
                pos = 0
                while pos < want:
                    if time.monotonic() > deadline:
                        raise _DeadlineExceeded(f"{pos} of {want} bytes had arrived")
                    n = body.readinto(out[pos:min(want, pos + _CHUNK)])
                    if not n:
                        raise _ShortRead(f"the body ended after {pos} of {want} bytes")
                    pos += n
                    self._count(bytes_read=n)
                # at the end: botocore checks the length and, for a whole object, its checksum
                if body.readinto(bytearray(1)):
                    raise _ShortRead(f"the body is longer than the {want} bytes announced")
                done = True
            finally:
                if not done:
                    body.close()  # drop the connection: it may still carry part of this body

        rng = f"bytes [{start}, {'end' if end is None else end})"
        self._call(get, key, f"reading {rng} of", S3ReadError, rng=(start, end))

    def _call(self, fn, key: str, doing: str, error: type[S3Error], *, missing_ok: bool = False,
              rng: tuple[int, int | None] | None = None):
        """Run ``fn(deadline)`` with retries, back-off and the overall deadline; turn failures into
        ``error`` with a message naming the bucket, key and fix."""
        t0 = time.monotonic()
        deadline = t0 + self.deadline_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn(deadline)
            except _OutOfRange as e:
                raise error(f"byte range [{rng[0]}, {rng[1]}) is past the end of {self.key_url(key)} "
                            f"(size {e.total})", bucket=self.bucket, key=key, code="InvalidRange") from None
            except _DeadlineExceeded as e:
                raise error(f"{doing} {self.key_url(key)} failed: no complete answer within the deadline of "
                            f"{self.deadline_s:g} s ({e}) after {attempt} attempt(s)", bucket=self.bucket,
                            key=key, code="Deadline", retryable=True) from None
            except Exception as e:
                verdict = _retryable(e)
                if verdict is None:
                    raise
                if missing_ok and not verdict and _error_code(_root_cause(e))[0] in _NOT_FOUND:
                    raise _Missing from None
                if not verdict:
                    raise self._permanent(e, key, doing, error, rng) from e
                now = time.monotonic()
                if attempt >= self.attempts or now >= deadline:
                    raise self._exhausted(e, key, doing, error, attempt, now - t0) from e
                pause = random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1)))
                if now + pause >= deadline:
                    raise self._exhausted(e, key, doing, error, attempt, now - t0) from e
                self._count(retries=1)
                time.sleep(pause)

    def _endpoint_and_source(self) -> tuple[str, str]:
        configured, source = self._configured_endpoint()
        try:
            url = self._client().meta.endpoint_url
        except Exception:  # noqa: BLE001 - only for a message
            url = configured or "?"
        if configured is not None:
            return url, source
        if not _is_aws_host(url):
            return url, "endpoint_url in the AWS config file"
        return url, "boto3's default for the region"

    def _region(self) -> str:
        try:
            return self._client().meta.region_name or "unset"
        except Exception:  # noqa: BLE001 - only for a message
            return "unset"

    def _permanent(self, e: BaseException, key: str, doing: str, error: type[S3Error],
                   rng: tuple[int, int | None] | None) -> S3Error:
        import botocore.exceptions as bx

        e = _root_cause(e)
        where = self.key_url(key)
        code, status = _error_code(e)
        kw = {"bucket": self.bucket, "key": key, "code": code}
        if isinstance(e, bx.NoCredentialsError):
            return error(f"no AWS credentials found for {where}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                         f"a profile (AWS_PROFILE), or run with an instance role", **kw)
        if isinstance(e, (bx.PartialCredentialsError, bx.CredentialRetrievalError)):
            return error(f"the AWS credentials for {where} are incomplete or could not be loaded ({e}): set "
                         f"AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE), or run with an "
                         f"instance role", **kw)
        if code == "NoSuchBucket" or (code in _NOT_FOUND and key == ""):
            return error(f"no such bucket {self.bucket!r} ({where}): check the bucket name and region "
                         f"(region {self._region()}, endpoint {self._endpoint_and_source()[0]})", **kw)
        if code in _NOT_FOUND:
            if code != "NoSuchKey" and not self._bucket_exists():  # HEAD answers a bare 404 for both
                return error(f"no such bucket {self.bucket!r} ({where}): check the bucket name and region "
                             f"(region {self._region()}, endpoint {self._endpoint_and_source()[0]})",
                             **{**kw, "code": "NoSuchBucket"})
            return error(f"no such key {where}; run `hetero prepare` to write shards there, or check the prefix",
                         **kw)
        if code in _DENIED:
            prefix_arn = f"arn:aws:s3:::{self.bucket}/{_join(self.prefix, '')}{'/' if self.prefix else ''}*"
            need = "s3:PutObject" if error is S3WriteError else "s3:GetObject and s3:ListBucket"
            return error(f"access denied to {where} while {doing.split(' ')[0]} it: the job's role / credentials "
                         f"need {need} on arn:aws:s3:::{self.bucket} and {prefix_arn}", **kw)
        if code in _BAD_KEYS:
            return error(f"S3 rejected the credentials used for {where} ({code}): check "
                         f"AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN or the profile", **kw)
        if code in _WRONG_REGION:
            return error(f"bucket {self.bucket!r} is not in region {self._region()} ({code}) for {where}: set "
                         f"AWS_DEFAULT_REGION / AWS_REGION to the bucket's region", **kw)
        if code in _RANGE and rng is not None:
            return error(f"byte range [{rng[0]}, {rng[1]}) is outside {where} ({code}): the object is shorter "
                         f"than the index says; rewrite the shards or the index", **kw)
        detail = f"{status} {code}: {e}" if code else f"{type(e).__name__}: {e}"
        return error(f"{doing} {where} failed ({detail})", **kw)

    def _exhausted(self, e: BaseException, key: str, doing: str, error: type[S3Error], attempts: int,
                   elapsed: float) -> S3Error:
        import botocore.exceptions as bx

        e = _root_cause(e)
        where = self.key_url(key)
        code, status = _error_code(e)
        what = f"{status} {code}" if code else f"{type(e).__name__}: {e}"
        msg = f"{doing} {where} failed after {attempts} attempt(s) in {elapsed:.1f} s; last error {what}"
        if isinstance(e, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
            url, source = self._endpoint_and_source()
            var = source if source.startswith("AWS_") else "AWS_ENDPOINT_URL"
            msg = (f"cannot reach the S3 endpoint {url} (from {source}) for {where} after {attempts} attempt(s) in "
                   f"{elapsed:.1f} s: check that it is up and that {var} is right, or unset it to use AWS")
        elif code in ("SlowDown", "503"):
            msg += " (S3 is throttling: spread keys over more prefixes or read with fewer threads)"
        return error(msg, bucket=self.bucket, key=key, code=code or type(e).__name__, retryable=True)

    def _bucket_exists(self) -> bool:
        try:
            self._client().head_bucket(Bucket=self.bucket)
            self._count(requests=1)
        except Exception as e:  # noqa: BLE001 - anything but a clear 404 counts as "exists"
            self._count(requests=1)
            return _error_code(e)[0] not in ("404", "NoSuchBucket", "NotFound")
        return True


class _Missing(Exception):
    """exists(): the object is not there."""


class _OutOfRange(Exception):
    def __init__(self, total: int) -> None:
        super().__init__(total)
        self.total = total


def _range_total(content_range: str | None) -> int | None:
    """The total size in a Content-Range header ``bytes a-b/total``."""
    if not content_range or "/" not in content_range:
        return None
    total = content_range.rsplit("/", 1)[1].strip()
    return int(total) if total.isdigit() else None


__all__ = ["INSTALL_HINT", "S3Error", "S3ReadError", "S3Store", "S3WriteError", "is_s3_url", "parse_s3_url"]
