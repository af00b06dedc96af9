"""Retrying S3 calls: back-off with full jitter, one deadline per call, and ranged GET bodies read whole.

Retries. botocore's own retries are off for reads: every GET is retried here, together with the
read of its body, because botocore never retries a body that breaks off (a reset, a stall, fewer
bytes than Content-Length). What is retried is ``s3_errors.retryable``'s call. Back-off is
exponential with full jitter (``uniform(0, min(backoff_max_s, backoff_base_s * 2**n))``).
The store's ``retries`` counts every retry. Writes (converters only) keep botocore's standard
retries too, so one failed part of a multipart upload is sent again alone; the store then retries
the whole call.

Deadlines. Each request has botocore connect and read timeouts of ``request_timeout_s`` (the read
timeout bounds any silence, so a body that stalls after its headers fails after that long), and
each call has an overall deadline ``deadline_s`` (default ``request_timeout_s * attempts``)
across its attempts and back-off sleeps: no attempt starts or sleeps past it, and a body still
trickling in is abandoned at it (checked every 256 KB), so a call returns or raises within about
``deadline_s + request_timeout_s``.
"""
from __future__ import annotations

import itertools
import random
import time
from typing import Any, Callable, Protocol

from . import s3_errors
from .base import StoreError
from .s3_errors import DeadlineExceeded, OutOfRange, ShortRead

CHUNK = 256 << 10  # body bytes read per call, between deadline checks


class Missing(Exception):
    """A call with ``missing_ok``: the object is not there."""


class Retried(s3_errors.Where, Protocol):
    """What a retried call needs of the store (``S3Store`` provides it): its limits, read when the
    call starts, and what its messages name."""

    attempts: int
    deadline_s: float
    backoff_base_s: float
    backoff_max_s: float


def call(store: Retried, fn: Callable[[float], Any], key: str, doing: str, error: type[StoreError],
         count: Callable[..., None], *, missing_ok: bool = False, rng: tuple[int, int | None] | None = None):
    """Run ``fn(deadline)`` with retries, back-off and the overall deadline; turn failures into
    ``error`` with a message naming the bucket, key and fix. ``count(retries=1)`` before each retry;
    ``missing_ok``: raise ``Missing`` when the object is not there."""
    t0 = time.monotonic()
    deadline = t0 + store.deadline_s
    for attempt in itertools.count(1):
        try:
            return fn(deadline)
        except OutOfRange as e:
            if rng is None:  # only a ranged read can be out of range
                raise error(f"read of {store.key_url(key)} is out of range (size {e.total})", bucket=store.bucket,
                            key=key, code="InvalidRange") from None
            raise error(f"byte range [{rng[0]}, {rng[1]}) is past the end of {store.key_url(key)} "
                        f"(size {e.total})", bucket=store.bucket, key=key, code="InvalidRange") from None
        except DeadlineExceeded as e:
            raise error(f"{doing} {store.key_url(key)} failed: no complete answer within the deadline of "
                        f"{store.deadline_s:g} s ({e}) after {attempt} attempt(s)", bucket=store.bucket,
                        key=key, code="Deadline", retryable=True) from None
        except Exception as e:
            verdict = s3_errors.retryable(e)
            if verdict is None:
                raise
            if missing_ok and not verdict and s3_errors.is_missing(e):
                raise Missing from None
            if not verdict:
                raise s3_errors.permanent(store, e, key, doing, error, rng) from e
            now = time.monotonic()
            pause = random.uniform(0, min(store.backoff_max_s, store.backoff_base_s * 2 ** (attempt - 1)))
            if attempt >= store.attempts or now + pause >= deadline:  # no attempt starts or sleeps past it
                raise s3_errors.exhausted(store, e, key, doing, error, attempt, now - t0) from e
            count(retries=1)
            time.sleep(pause)


def read_body(resp: dict, start: int, end: int | None, deadline: float, count: Callable[..., None]) -> bytearray:
    """The body of a GET of bytes [start, end) (end None: to the object's end), read whole, calling
    ``count(bytes_read=n)`` for each piece. A body shorter or longer than the range, or announced so,
    raises ``ShortRead`` (retried); a range past the object's end ``OutOfRange``; the deadline passing
    mid-body ``DeadlineExceeded``. A body not read to its end is closed, dropping its connection."""
    body = resp["Body"]
    done = False
    try:
        length = int(resp["ContentLength"])
        want = end - start if end is not None else length
        if length != want:
            total = s3_errors.range_total(resp.get("ContentRange"))
            if total is not None and end is not None and end > total:
                raise OutOfRange(total)
            raise ShortRead(f"the server announced {length} bytes for a range of {want}")
        buf = bytearray(want)
        out = memoryview(buf)
        pos = 0
        while pos < want:
            if time.monotonic() > deadline:
                raise DeadlineExceeded(f"{pos} of {want} bytes had arrived")
            n = body.readinto(out[pos:min(want, pos + CHUNK)])
            if not n:
                raise ShortRead(f"the body ended after {pos} of {want} bytes")
            pos += n
            count(bytes_read=n)
        # at the end: botocore checks the length and, for a whole object, its checksum
        if body.readinto(bytearray(1)):
            raise ShortRead(f"the body is longer than the {want} bytes announced")
        done = True
    finally:
        if not done:
            body.close()  # drop the connection: it may still carry part of this body
    return buf
