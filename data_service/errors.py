"""Exceptions shared by server and consumer. Each message names the bad value and the fix."""
from __future__ import annotations


class DataServiceError(RuntimeError):
    """Base class of every error this package raises on purpose."""


class ConfigError(DataServiceError, ValueError):
    """Bad option or pipeline, found at start-up."""


class ProtocolError(DataServiceError):
    """A peer sent bytes that do not follow heterodata.v1."""


class VersionMismatchError(ProtocolError):
    """Client and server speak different major protocol versions."""


class PermissionDeniedError(DataServiceError):
    """The job token was missing or wrong."""


class ServerUnavailableError(DataServiceError):
    """No server answered within the deadline."""


class BatchBuildError(DataServiceError):
    """User code (dataset, transform, collate) raised while building a batch.

    Carries the epoch, batch index, sample index and the worker's traceback,
    in the spirit of torch's ExceptionWrapper: the consumer re-raises it with
    that context instead of a bare "worker died".
    """

    def __init__(self, message: str, *, epoch: int, index: int, sample_index: int,
                 remote_traceback: str, server: str = "") -> None:
        self.epoch = epoch
        self.index = index
        self.sample_index = sample_index
        self.remote_traceback = remote_traceback
        self.server = server
        where = f" on server {server}" if server else ""
        sample = f", sample {sample_index}" if sample_index >= 0 else ""
        super().__init__(f"building epoch {epoch}, batch {index}{sample} failed{where}: {message}\n"
                         f"--- original traceback (data worker) ---\n{remote_traceback}")


class BatchFailedError(DataServiceError):
    """One batch failed on ``batch_attempts`` attempts in a row (its bytes failed their checksum,
    a server answered it with an error, or the connection ended before it came): the iteration
    ends instead of asking again forever.

    Carries the batch (``epoch``, ``index``), ``servers`` (the server of each attempt, in order)
    and ``checksums`` (``(expected, got)`` CRC-32 pairs of the attempts whose bytes arrived
    damaged).
    """

    def __init__(self, message: str, *, epoch: int, index: int, servers: list[str],
                 checksums: list[tuple[int, int]]) -> None:
        self.epoch = epoch
        self.index = index
        self.servers = servers
        self.checksums = checksums
        super().__init__(message)


def install_extra(extra: str) -> str:
    """How to add the optional dependencies of ``extra`` (pyproject.toml): the package installs from its
    checkout, not from a package index."""
    return f"pip install -e '.[{extra}]' in the hetero-data-service checkout"


def check_integer(name: str, value: object, low: int, high: int | None = None, hint: str = "") -> None:
    """The one check of a whole-number option: a ConfigError naming ``name`` and its range unless ``value`` is an
    int (not a bool) in ``low``..``high``; ``hint`` (e.g. " (0 = off)") ends the message."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(f"{name}={value!r} must be an integer {span}{hint}")
