"""How often each batch failed in one iteration, and the error that ends it when one failed too often.

An attempt is one request for a batch to one server. It fails when the batch's bytes arrive and
fail their CRC-32, when the server answers it with an error, or when the connection ends (broken,
refused as damaged, or dropped after ``batch_timeout``) before the batch came: which batches such
an end counts against is the scheduler's call (``Scheduler.charged``). Hedged copies are attempts
too. Counts live as long as the iteration: a reconnect, to the same server or another, never
resets them, and a batch arrives at most once, so every failure of a batch is one "in a row".
The ``limit``-th failure of one batch raises ``BatchFailedError``, naming the batch, the server of
each attempt and the checksums seen, instead of asking again forever.
"""
from __future__ import annotations

from dataclasses import dataclass

from data_service.contract.batch_id import BatchId
from data_service.errors import BatchFailedError


@dataclass(frozen=True)
class Failure:
    """One failed attempt: its server, what went wrong, and the CRC-32s when its bytes arrived damaged."""

    server: str
    what: str
    expected: int | None = None  # the data worker's CRC-32 of the batch
    got: int | None = None       # the CRC-32 of the bytes that arrived

    def describe(self) -> str:
        if self.expected is not None and self.got is not None:
            return (f"{self.server}: its bytes failed their CRC-32 (expected {self.expected:#010x} from the data "
                    f"worker, got {self.got:#010x})")
        return f"{self.server}: {self.what}"


class Attempts:
    """Failed attempts per batch of one iteration; ``failed`` raises at the ``limit``-th of one batch."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._failures: dict[BatchId, list[Failure]] = {}

    def count(self, batch: BatchId) -> int:
        return len(self._failures.get(batch, ()))

    def failed(self, batch: BatchId, failure: Failure) -> None:
        """Count one failed attempt at ``batch``.

        Raises:
            BatchFailedError: it is the batch's ``limit``-th.
        """
        seen = self._failures.setdefault(batch, [])
        seen.append(failure)
        if len(seen) >= self.limit:
            raise exhausted(batch, seen, self.limit)


def exhausted(batch: BatchId, failures: list[Failure], limit: int) -> BatchFailedError:
    """The error of a batch that failed ``limit`` attempts in a row."""
    servers = list(dict.fromkeys(f.server for f in failures))
    checksums = [(f.expected, f.got) for f in failures if f.expected is not None and f.got is not None]
    attempts = "; ".join(f"[{n}] {f.describe()}" for n, f in enumerate(failures, 1))
    if checksums:
        advice = ("the same batch arrived damaged on every attempt: something on the way between this host and "
                  f"{', '.join(servers)} changes bytes (a NIC, a switch, a proxy, a server's memory); check that path")
    else:
        advice = f"check {', '.join(servers)} and the network to {'them' if len(servers) > 1 else 'it'}"
    return BatchFailedError(
        f"{batch} failed {len(failures)} attempts in a row (batch_attempts={limit}), so "
        f"the iteration ends instead of asking again: {attempts}. Servers tried: {', '.join(servers)}; {advice}. "
        "batch_attempts= sets how many attempts a batch gets",
        epoch=batch.epoch, index=batch.index, servers=[f.server for f in failures], checksums=checksums)
