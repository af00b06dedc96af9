"""The autoscaler's state beside the job's registry: ``<registry>/autoscale/state.json``.

The policy's state (last action and when, nodes promised, votes), the nodes the actuator started
and the servers drained, and the latest decisions. It lives beside the registry (a folder or S3)
rather than in rank 0's memory, so a rank 0 that restarts, or a job resumed from its checkpoint
with the same registry, carries on with the cooldown, the promised nodes and the history it had.
Written atomically (``data_service.storage``) after every decision; read once at start. JSON only.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from data_service.errors import ConfigError
from data_service.storage import StoreError, open_store

log = logging.getLogger(__name__)

KEY = "autoscale/state.json"
HISTORY_KEEP = 100  # decisions kept in the state and in metrics.json


class StateStore:
    """Reads and writes the autoscaler's state beside ``registry``; a failed write is logged, not fatal."""

    def __init__(self, registry: str, timeout_s: float = 10.0) -> None:
        self.registry = registry
        self._store = open_store(registry, what="registry", create=True, request_timeout_s=max(0.5, timeout_s / 2),
                                 attempts=2, deadline_s=timeout_s, backoff_max_s=0.5)

    @property
    def url(self) -> str:
        return self._store.key_url(KEY)

    def load(self) -> dict[str, Any]:
        """The saved state ({} when there is none or it cannot be read: then it starts afresh, logged)."""
        try:
            data = self._store.read(KEY)
        except StoreError as exc:
            if not exc.missing:
                log.warning("autoscale: cannot read %s (%s); starting without the saved state", self.url, exc)
            return {}
        except ConfigError:
            return {}
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            log.warning("autoscale: %s is not JSON (%s); starting without the saved state", self.url, exc)
            return {}
        return obj if isinstance(obj, dict) else {}

    def save(self, state: dict[str, Any]) -> None:
        state = dict(state, history=list(state.get("history", []))[-HISTORY_KEEP:])
        try:
            self._store.write_bytes(KEY, json.dumps(state, sort_keys=True, default=str).encode())
        except (StoreError, ConfigError, OSError) as exc:
            log.warning("autoscale: cannot write %s (%s); a restart would not see the last decision", self.url, exc)
