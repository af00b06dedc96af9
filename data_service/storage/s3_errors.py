"""What an S3 failure means: whether to retry it, and the message that names the object and the fix.

``retryable`` sorts an exception: retried are 500, 502, 503 (SlowDown), 504, throttling codes,
connection errors and resets, connect and read timeouts, short or damaged bodies; not retried are
400, 403, 404 (NoSuchKey, NoSuchBucket), 416 and missing credentials. ``permanent`` and
``exhausted`` turn a failure into a ``StoreError`` saying what is wrong: no such bucket, no such
key, access denied (and the permissions needed), rejected or missing credentials, the wrong region,
a range past the end, an endpoint that cannot be reached (and the variable it came from).
"""
from __future__ import annotations

import contextlib
from typing import Any, Protocol

from .base import NOT_FOUND, StoreError, StoreWriteError
from .parsing import join_key

_RETRY_STATUS = {500, 502, 503, 504, 429}
_RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
                "RequestLimitExceeded", "TooManyRequestsException", "RequestTimeout", "RequestTimeoutException",
                "InternalError", "ServiceUnavailable", "BandwidthLimitExceeded", "PriorRequestNotComplete",
                "EC2ThrottledException"}
_DENIED = {"403", "AccessDenied", "Forbidden", "AllAccessDisabled", "AccountProblem"}
_BAD_KEYS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "TokenRefreshRequired"}
_WRONG_REGION = {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301"}
_RANGE = {"416", "InvalidRange"}


class ShortRead(Exception):
    """The body ended (or the server announced) fewer bytes than the range asked for."""


class DeadlineExceeded(Exception):
    """The call's overall deadline passed while a body was still arriving."""


class OutOfRange(Exception):
    """The range asked for ends past the object's end (``total`` bytes)."""

    def __init__(self, total: int) -> None:
        super().__init__(total)
        self.total = total


class Where(Protocol):
    """What a message needs to know of the store (``S3Store`` provides it)."""

    bucket: str
    prefix: str

    def key_url(self, key: str) -> str: ...

    def region(self) -> str: ...

    def endpoint_and_source(self) -> tuple[str, str]: ...

    def bucket_exists(self) -> bool: ...


def is_aws_host(url: str | None) -> bool:
    host = (url or "").split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0].lower()
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn", ".api.aws"))


def error_code(e: BaseException) -> tuple[str, int | None]:
    """(the S3 error code, the HTTP status) of a botocore ClientError; ("", None) for anything else."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return "", None
    return str(response.get("Error", {}).get("Code", "")), response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def root_cause(e: BaseException) -> BaseException:
    """boto3's S3UploadFailedError hides the ClientError it came from in __context__."""
    if type(e).__name__ == "S3UploadFailedError" and e.__context__ is not None:
        return e.__context__
    return e


def is_missing(e: BaseException) -> bool:
    """The object (or bucket) is not there: a 404 of any kind."""
    return error_code(root_cause(e))[0] in NOT_FOUND


def retryable(e: BaseException) -> bool | None:
    """True: retry. False: fail at once. None: not an S3/transport error (let it through)."""
    import botocore.exceptions as bx

    e = root_cause(e)
    if isinstance(e, bx.ClientError):
        code, status = error_code(e)
        return status in _RETRY_STATUS or code in _RETRY_CODES
    if isinstance(e, (ShortRead, bx.FlexibleChecksumError, bx.HTTPClientError, bx.ConnectionError,
                      bx.IncompleteReadError, bx.ReadTimeoutError)):
        return True  # short or damaged bodies, connection errors, resets, connect/read timeouts
    if isinstance(e, bx.BotoCoreError):
        return False  # missing, partial or unloadable credentials, bad parameters, ...
    with contextlib.suppress(ImportError):  # pragma: no cover - botocore depends on urllib3
        import urllib3.exceptions as ux
        if isinstance(e, ux.HTTPError):
            return True
    import http.client
    if isinstance(e, (ConnectionError, TimeoutError, http.client.HTTPException)):
        return True  # socket-level resets and timeouts; other OSErrors (a missing local file) are not S3's
    return None


def permanent(where: Where, e: BaseException, key: str, doing: str, error: type[StoreError],
              rng: tuple[int, int | None] | None) -> StoreError:
    """The error for a failure that retrying cannot help, naming the object and the fix."""
    import botocore.exceptions as bx

    e = root_cause(e)
    url = where.key_url(key)
    bucket = where.bucket
    code, status = error_code(e)
    kw: dict[str, Any] = {"bucket": bucket, "key": key, "code": code}
    if isinstance(e, bx.NoCredentialsError):
        return error(f"no AWS credentials found for {url}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                     f"a profile (AWS_PROFILE), or run with an instance role", **kw)
    if isinstance(e, (bx.PartialCredentialsError, bx.CredentialRetrievalError)):
        return error(f"the AWS credentials for {url} are incomplete or could not be loaded ({e}): set "
                     f"AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE), or run with an "
                     f"instance role", **kw)
    no_bucket = (f"no such bucket {bucket!r} ({url}): check the bucket name and region "
                 f"(region {where.region()}, endpoint {where.endpoint_and_source()[0]})")
    if code == "NoSuchBucket" or (code in NOT_FOUND and key == ""):
        return error(no_bucket, **kw)
    if code in NOT_FOUND:
        if code != "NoSuchKey" and not where.bucket_exists():  # HEAD answers a bare 404 for both
            return error(no_bucket, **{**kw, "code": "NoSuchBucket"})
        return error(f"no such key {url}; run `hetero prepare` to write shards there, or check the prefix", **kw)
    if code in _DENIED:
        prefix_arn = f"arn:aws:s3:::{bucket}/{join_key(where.prefix, '')}{'/' if where.prefix else ''}*"
        need = "s3:PutObject" if issubclass(error, StoreWriteError) else "s3:GetObject and s3:ListBucket"
        return error(f"access denied to {url} while {doing.split(' ')[0]} it: the job's role / credentials "
                     f"need {need} on arn:aws:s3:::{bucket} and {prefix_arn}", **kw)
    if code in _BAD_KEYS:
        return error(f"S3 rejected the credentials used for {url} ({code}): check "
                     f"AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN or the profile", **kw)
    if code in _WRONG_REGION:
        return error(f"bucket {bucket!r} is not in region {where.region()} ({code}) for {url}: set "
                     f"AWS_DEFAULT_REGION / AWS_REGION to the bucket's region", **kw)
    if code in _RANGE and rng is not None:
        return error(f"byte range [{rng[0]}, {rng[1]}) is outside {url} ({code}): the object is shorter "
                     f"than the index says; rewrite the shards or the index", **kw)
    detail = f"{status} {code}: {e}" if code else f"{type(e).__name__}: {e}"
    return error(f"{doing} {url} failed ({detail})", **kw)


def exhausted(where: Where, e: BaseException, key: str, doing: str, error: type[StoreError], attempts: int,
              elapsed: float) -> StoreError:
    """The error for a transient failure that outlasted the retries or the deadline."""
    import botocore.exceptions as bx

    e = root_cause(e)
    url = where.key_url(key)
    code, status = error_code(e)
    what = f"{status} {code}" if code else f"{type(e).__name__}: {e}"
    msg = f"{doing} {url} failed after {attempts} attempt(s) in {elapsed:.1f} s; last error {what}"
    if isinstance(e, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
        endpoint, source = where.endpoint_and_source()
        var = source if source.startswith("AWS_") else "AWS_ENDPOINT_URL"
        msg = (f"cannot reach the S3 endpoint {endpoint} (from {source}) for {url} after {attempts} attempt(s) in "
               f"{elapsed:.1f} s: check that it is up and that {var} is right, or unset it to use AWS")
    elif code in ("SlowDown", "503"):
        msg += " (S3 is throttling: spread keys over more prefixes or read with fewer threads)"
    return error(msg, bucket=where.bucket, key=key, code=code or type(e).__name__, retryable=True)


def range_total(content_range: str | None) -> int | None:
    """The total size in a Content-Range header ``bytes a-b/total``."""
    if not content_range or "/" not in content_range:
        return None
    total = content_range.rsplit("/", 1)[1].strip()
    return int(total) if total.isdigit() else None
