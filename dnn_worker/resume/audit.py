"""The audit log: one JSON line per batch the training loop received.

Every consumer stage (``RemoteDataset``/``LocalDataset``, ``ResumableLoader``, ``DeviceFeeder``,
the Lightning DataModule) can write it, but only the outermost one does: a stage that wraps
another takes the audit over (``take_audit``), so a batch an inner stage prefetched but the loop
never received is not logged. Lines are ``{"epoch", "batch", "rank", "sha256"}``; the digest is of
the host batch as the data plane delivered it (before any device-side finish stage).
"""
from __future__ import annotations

import json
import os
from typing import Any

from data_service.contract.batch_id import BatchId
from data_service.contract.tensor_layout import batch_digest


class AuditLog:
    """Appends audit lines to ``path``; one O_APPEND write per line, so ranks may share a file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def write(self, batch: BatchId, rank: int, digest: str) -> None:
        """One line: ``batch`` reached the training loop of ``rank`` with ``digest``."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        line = json.dumps({"epoch": batch.epoch, "batch": batch.index, "rank": rank, "sha256": digest}) + "\n"
        os.write(self._fd, line.encode())  # one write per line: atomic across processes

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        self.close()


digest = batch_digest  # the sha256 of a host batch as the audit records it


class AuditedStage:
    """A stage that wraps another: it writes the audit (``audit_path``), and a wrapper of its own takes it over."""

    _audit: AuditLog | None = None

    @property
    def audit_path(self) -> str | None:
        return self._audit.path if self._audit is not None else None

    @audit_path.setter
    def audit_path(self, value: str | None) -> None:
        self._audit = AuditLog(value) if value else None


def take_audit(inner: Any) -> AuditLog | None:
    """Move the audit from ``inner`` (a wrapped stage) to its wrapper: the caller writes it now."""
    path = getattr(inner, "audit_path", None)
    if path is None:
        return None
    inner.audit_path = None
    return AuditLog(path)
