"""The data node: serve the pipeline until a DNN node shuts us down, with a watchdog.

Exit codes: 0 after a clean (authenticated) shutdown or SIGTERM; ``EXIT_NO_CONSUMER`` when no
consumer connected within ``watchdog_connect_s``; ``EXIT_CONSUMERS_GONE`` when every consumer
has been gone for ``watchdog_idle_s``. The watchdog keeps a broken job from billing for hours.

With ``registry`` (this job's) or ``join`` (another job's), the node registers its server there
once it serves and unregisters first when it leaves (docs/elastic.md). A node that joined another
job has no first-consumer deadline (it may join before that job's trainers start, or between
its epochs), except a sweep's data job (it has a batch window and starts before its jobs); once its
consumers have all been gone for ``watchdog_idle_s`` the job it joined has ended, and it exits 0.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import cast

from data_service.server import DataServer

from ..config import LaunchConfig
from ..job.output_files import write_json
from ..metric_lines import RATE_EVERY_S, rate_line
from .server import advertised_address, start_server

log = logging.getLogger(__name__)

EXIT_NO_CONSUMER = 3
EXIT_CONSUMERS_GONE = 4


@dataclass(frozen=True)
class Watchdog:
    """Decides when an unattended data server should give up.

    Args:
        connect_s: deadline for the first consumer, from start.
        idle_s: how long all consumers may be gone once one has come.
    """

    connect_s: float
    idle_s: float
    joined: bool = False  # serving another job's registry: idle ends it cleanly (exit 0) ...
    first_deadline: bool = False  # ... and, only with this, a first-consumer deadline (a sweep's data job)

    def verdict(self, ever_connected: bool, seconds_since_last_consumer: float,
                uptime_s: float) -> tuple[int, str] | None:
        """None to keep serving, else (exit code, reason)."""
        if not ever_connected:
            if uptime_s > self.connect_s and (self.first_deadline or not self.joined):
                return EXIT_NO_CONSUMER, (f"no consumer connected within watchdog_connect_s={self.connect_s:g}s; "
                                          "are the DNN nodes running with the same job token?")
            return None
        if seconds_since_last_consumer > self.idle_s:
            if self.joined:
                return 0, (f"all consumers of the joined job gone for {seconds_since_last_consumer:.0f}s "
                           f"(watchdog_idle_s={self.idle_s:g}s): that job has ended")
            return EXIT_CONSUMERS_GONE, (f"all consumers gone for {seconds_since_last_consumer:.0f}s "
                                         f"(watchdog_idle_s={self.idle_s:g}s) and no shutdown came")
        return None


def watchdog_for(cfg: LaunchConfig) -> Watchdog:
    """The node's watchdog. A node joining a running job waits for consumers without a deadline;
    a sweep's data job (``join`` with a ``batch_window``) starts before its jobs, so it keeps the
    first-consumer deadline: jobs that never come (all failed at start) do not leave it billing."""
    joined = bool(cfg.elastic.join)
    sweep = joined and cfg.serve.batch_window > 0
    return Watchdog(cfg.serve.watchdog_connect_s, cfg.serve.watchdog_idle_s, joined=joined, first_deadline=sweep)


class RateMeter:
    """Batches/s a data server sends: per window, and over its serving time (from the first poll
    that saw a consumer, so the wait for the DNN nodes does not dilute it).

    Args:
        every_s: window length; :meth:`poll` returns a line to log when one closes.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(self, every_s: float = RATE_EVERY_S, clock=time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self.first: float | None = None
        self._mark: tuple[float, int] | None = None

    def poll(self, consumer_ever_connected: bool, batches_sent: int) -> str | None:
        """Note the server's counters; a window's :func:`rate_line` when one has closed, else None."""
        now = self.clock()
        if self.first is None:
            if not consumer_ever_connected:
                return None
            self.first = now
            self._mark = (now, batches_sent)
            return None
        since, before = cast("tuple[float, int]", self._mark)  # set with first
        if now - since < self.every_s:
            return None
        self._mark = (now, batches_sent)
        return rate_line(batches_sent, (batches_sent - before) / (now - since), now - since, final=False)

    def final(self, batches_sent: int) -> tuple[float | None, float]:
        """(batches/s over the serving time or None if no consumer came, serving seconds)."""
        if self.first is None:
            return None, 0.0
        seconds = self.clock() - self.first
        return (batches_sent / seconds if seconds > 0 else None), seconds


def serve_until_shutdown(server: DataServer, watchdog: Watchdog, poll_s: float = 1.0,
                         meter: RateMeter | None = None) -> tuple[int, str]:
    """Block until the server stops (0) or the watchdog fires (non-zero); returns (code, reason).

    With ``meter``, logs the server's batches/s once per window.
    """
    started = time.monotonic()
    while not server.wait(timeout=poll_s):
        snap = server.stats.snapshot()
        line = meter.poll(snap.consumer_ever_connected, snap.batches_sent) if meter is not None else None
        if line:
            log.info("%s", line)
        verdict = watchdog.verdict(snap.consumer_ever_connected, snap.seconds_since_last_consumer,
                                   time.monotonic() - started)
        if verdict is not None:
            code, reason = verdict
            log.log(logging.ERROR if code else logging.INFO, "watchdog: %s; shutting down with exit code %d",
                    reason, code)
            server.leave_delay_s = 0.0  # no consumer is left to see its registry entry go
            server.shutdown(grace_s=5.0, reason=f"watchdog: {reason}")
            return code, reason
    return 0, "shut down"


def run_data_node(cfg: LaunchConfig, token: str, port: int, output_dir: str, host: str) -> int:
    """Serve until shutdown; write ``data_node.json`` (server stats) to ``output_dir``."""
    server = start_server(cfg, token, port)
    log.info("healthy: serving %s on %s (%d workers); waiting for the DNN nodes", cfg.data.pipeline,
             server.address, server.options.num_workers)
    uri = cfg.elastic.join or cfg.elastic.registry
    if uri:
        from data_service.membership.joining import join

        address = advertised_address(cfg, host, server.port)
        try:
            join(server, uri, address)
        except Exception:
            server.shutdown(grace_s=1.0, reason="could not register")
            raise
        log.info("registered in %s as %s%s", uri, address, " (joined another job)" if cfg.elastic.join else "")
    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()
        server.shutdown(grace_s=10.0, reason=f"signal {signal.Signals(signum).name}", block=False)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
    meter = RateMeter()
    try:
        code, reason = serve_until_shutdown(server, watchdog_for(cfg), meter=meter)
    finally:
        if uri:  # however serving ended, the entry goes (a no-op after a clean leave)
            from data_service.membership.registry import RegistryError, unregister

            try:
                unregister(uri, server.server_id)
            except RegistryError as exc:
                log.warning("could not remove this server's entry from %s: %s", uri, exc)
    snap = server.stats.snapshot()
    rate, serving_s = meter.final(snap.batches_sent)
    write_json(os.path.join(output_dir, "data_node.json"), {
        "host": host, "role": "data", "exit_code": code, "reason": reason, "batches_sent": snap.batches_sent,
        "bytes_sent": snap.bytes_sent, "batches_built": snap.batches_built, "workers": snap.workers,
        "worker_busy_fraction": snap.worker_busy_fraction, "uptime_s": snap.uptime_s,
        "samples_skipped": snap.samples_skipped,
        "serving_s": serving_s, "batches_per_s": None if rate is None else round(rate, 4),
        # the batch window's counters (a sweep's data group): hits, batches built again, bytes held
        "window": {k: v for k, v in snap.pipeline.items() if k.startswith("window_") or k == "batches_built_again"}})
    # read by the job's MetricDefinitions (data:batches_per_s)
    log.info("data node exits with %d (%s): %s", code, reason, rate_line(snap.batches_sent, rate, serving_s, final=True))
    return code
