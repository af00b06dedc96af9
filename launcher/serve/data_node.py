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
import time

# the node's exit codes are the data server's (EXIT_NO_CONSUMER named here for the node's callers too)
from data_service.server.lifetime import EXIT_CONSUMERS_GONE, EXIT_NO_CONSUMER, IdleExit, ServerLife  # noqa: F401
from data_service.server.stats import WindowFigures

from ..config import LaunchConfig
from ..job.output_files import write_json
from ..metric_lines import RATE_EVERY_S, rate_line
from .server import advertised_address, start_server

log = logging.getLogger(__name__)


def watchdog_for(cfg: LaunchConfig) -> IdleExit:
    """The node's watchdog. A node joining a running job waits for consumers without a deadline;
    a sweep's data job (``join`` with a ``batch_window``) starts before its jobs, so it keeps the
    first-consumer deadline: jobs that never come (all failed at start) do not leave it billing."""
    joined = bool(cfg.elastic.join)
    deadline = not joined or cfg.serve.batch_window > 0
    return IdleExit(cfg.serve.watchdog_idle_s, cfg.serve.watchdog_connect_s if deadline else None,
                    idle_code=0 if joined else EXIT_CONSUMERS_GONE, idle_option="watchdog_idle_s")


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
        self._mark = (0.0, 0)  # (when, batches sent) at the start of the window

    def poll(self, consumer_ever_connected: bool, batches_sent: int) -> str | None:
        """Note the server's counters; a window's :func:`rate_line` when one has closed, else None."""
        now = self.clock()
        if self.first is None:
            if consumer_ever_connected:
                self.first, self._mark = now, (now, batches_sent)
            return None
        since, before = self._mark
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


def run_data_node(cfg: LaunchConfig, token: str, port: int, output_dir: str, host: str) -> int:
    """Serve until shutdown; write ``data_node.json`` (server stats) to ``output_dir``."""
    server = start_server(cfg, token, port)
    log.info("healthy: serving %s on %s (%d workers); waiting for the DNN nodes", cfg.data.pipeline,
             server.address, server.options.num_workers)
    life = ServerLife(server, watchdog_for(cfg))
    uri = cfg.elastic.join or cfg.elastic.registry
    if uri:
        address = advertised_address(cfg, host, server.port)
        life.join(uri, address)
        log.info("registered in %s as %s%s", uri, address, " (joined another job)" if cfg.elastic.join else "")
    meter = RateMeter()

    def log_rate(snap) -> None:
        line = meter.poll(snap.consumer_ever_connected, snap.batches_sent)
        if line:
            log.info("%s", line)

    code, reason = life.run(on_poll=log_rate) or (0, "shut down")
    snap = server.stats.snapshot()
    rate, serving_s = meter.final(snap.batches_sent)
    window = WindowFigures.of(snap)
    write_json(os.path.join(output_dir, "data_node.json"), {
        "host": host, "role": "data", "exit_code": code, "reason": reason, "batches_sent": snap.batches_sent,
        "bytes_sent": snap.bytes_sent, "batches_built": snap.batches_built, "workers": snap.workers,
        "worker_busy_fraction": snap.worker_busy_fraction, "uptime_s": snap.uptime_s,
        "samples_skipped": snap.samples_skipped,
        "serving_s": serving_s, "batches_per_s": None if rate is None else round(rate, 4),
        # the batch window's counters (a sweep's data group): hits, batches built again, bytes held
        "window": None if window is None else window.to_json()})
    # read by the job's MetricDefinitions (data:batches_per_s)
    log.info("data node exits with %d (%s): %s", code, reason, rate_line(snap.batches_sent, rate, serving_s, final=True))
    return code
