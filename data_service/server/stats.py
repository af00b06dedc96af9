"""Server counters behind the GetStats call."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..protocol.generated import pb

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..pool.worker_pool import WorkerPool


@dataclass(frozen=True)
class WindowFigures:
    """The batch window's counters at one moment (``pb.WindowStats`` says what each counts): a record
    of their own in the stats reply (``Stats.window``) and in ``data_node.json``, apart from the
    pipeline's figures, so no figure a pipeline names (``window_hits``) changes them."""

    hits: int = 0
    joined: int = 0
    misses: int = 0
    built_again: int = 0
    unwindowed: int = 0
    built_ahead: int = 0
    ahead_used: int = 0
    evicted: int = 0
    held_bytes: int = 0
    batches: int = 0
    budget_bytes: int = 0

    @classmethod
    def of(cls, stats: pb.Stats) -> "WindowFigures | None":
        """The counters of a stats reply; None from a server without a window."""
        return cls.from_json({f.name: getattr(stats.window, f.name) for f in fields(cls)}) \
            if stats.HasField("window") else None

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "WindowFigures":
        """The counters :meth:`to_json` wrote; TypeError for a key that names none (one missing is 0)."""
        return cls(**{k: int(v) for k, v in doc.items()})


class ServerStats:
    """Counts batches, bytes and consumers; ``snapshot()`` adds the worker pool's figures.

    Args:
        pool: the worker pool whose counters the snapshot reports.
    """

    def __init__(self, pool: "WorkerPool") -> None:
        self._pool = pool
        self._lock = threading.Lock()
        # the pipeline's stats() (Pipeline.stats), set by the server
        self.pipeline_stats: Callable[[], Mapping[str, float]] | None = None
        # the batch window's counters (SharedBuilds.figures), set by the server when it has a window
        self.window_figures: Callable[[], WindowFigures] | None = None
        self.started = time.monotonic()
        self.batches_sent = 0
        self.bytes_sent = 0
        self.raw_bytes = 0
        self.send_s = 0.0
        self.compress_s = 0.0
        self.streams_total = 0
        self.auth_failures = 0
        self.consumer_ever_connected = False
        self._consumers = 0
        self._last_consumer_left = time.monotonic()

    def record_sent(self, wire_bytes: int, raw_bytes: int, seconds: float, payload_bytes: int = 0,
                    compress_s: float = 0.0) -> None:
        """Count one batch; in shared-memory mode ``wire_bytes`` is only the header, so the
        payload counts as sent too."""
        with self._lock:
            self.batches_sent += 1
            self.bytes_sent += max(wire_bytes, payload_bytes)
            self.raw_bytes += raw_bytes
            self.send_s += seconds
            self.compress_s += compress_s

    def stream_opened(self) -> None:
        with self._lock:
            self.streams_total += 1

    def consumer_connected(self) -> None:
        with self._lock:
            self._consumers += 1
            self.consumer_ever_connected = True

    def stream_closed(self, was_consumer: bool) -> None:
        if not was_consumer:
            return
        with self._lock:
            self._consumers -= 1
            if self._consumers == 0:
                self._last_consumer_left = time.monotonic()

    def seconds_since_last_consumer(self) -> float:
        """-1 while a consumer is connected; else seconds since the last one left (or since start)."""
        with self._lock:
            return -1.0 if self._consumers > 0 else time.monotonic() - self._last_consumer_left

    def snapshot(self) -> pb.Stats:
        pool = self._pool
        slots, slot_bytes = pool.slots_in_use()
        idle_s = self.seconds_since_last_consumer()
        with self._lock:
            return pb.Stats(
                batches_built=pool.batches_built, batches_sent=self.batches_sent,
                bytes_sent=self.bytes_sent, queue_depth=pool.queue_depth,
                workers=len(pool.worker_pids()), worker_busy_fraction=pool.busy_fraction(),
                active_streams=self._consumers, streams_total=self.streams_total,
                batch_errors=pool.batch_errors, worker_restarts=pool.restarts,
                auth_failures=self.auth_failures, uptime_s=time.monotonic() - self.started,
                slots_in_use=slots, bytes_in_slots=slot_bytes, raw_bytes=self.raw_bytes,
                compress_s=self.compress_s,
                seconds_since_last_consumer=idle_s,
                consumer_ever_connected=self.consumer_ever_connected,
                shm_leases=pool.leases, slots_retired=pool.retired, samples_skipped=pool.samples_skipped,
                pipeline=self._pipeline_figures(),
                window=None if self.window_figures is None else pb.WindowStats(**self.window_figures().to_json()))

    def _pipeline_figures(self) -> dict[str, float]:
        # samples_reread rides in this map: Stats has no field of its own for it, and a new one
        # would change the protocol for a figure only people read
        figures = {"samples_reread": float(getattr(self._pool, "samples_reread", 0))}
        if self.pipeline_stats is None:
            return figures
        try:
            figures.update({str(k): float(v) for k, v in self.pipeline_stats().items()})
        except Exception as exc:  # a stats call must not fail because of the pipeline's own figures
            log.warning("the pipeline's stats() failed: %s", exc)
        return figures
