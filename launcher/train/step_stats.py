"""Step timing of one trainer rank, and the job's ``metrics.json``.

A step's time runs from the end of the previous step to the end of this one, so it holds
the wait for the batch (the *data wait*) plus the compute. The first ``warmup`` steps
(queues filling, workers starting) are left out of every average; the count is reported.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ..metric_lines import StepFigures, window_line

log = logging.getLogger(__name__)


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        return batch_size_of(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, (list, tuple)):
        return batch_size_of(batch[0]) if batch else 0
    return 1


class StepStats:
    """Per-rank counters; ``log_every`` steps it logs the recent average step time.

    Args:
        warmup: first steps left out of the averages.
        log_every: steps between window lines.
        label: prefix of the window lines.
        advisor: rank 0's ``launcher.advice.advisor.LiveAdvisor`` (None elsewhere): told every step, asked
            for the end-of-training advice by :meth:`summary`.
        autoscaler: rank 0's ``launcher.autoscale.Autoscaler`` (None: none): given every periodic
            advice the advisor makes; its summary goes into the end-of-training advice.
    """

    def __init__(self, warmup: int, log_every: int, label: str = "", advisor=None, autoscaler=None) -> None:
        self.warmup = warmup
        self.log_every = log_every
        self.label = label
        self.advisor = advisor
        self.autoscaler = autoscaler
        self._advised = None  # the advisor's last advice already given to the autoscaler
        self.steps = 0
        self.samples = 0
        self.total_s = 0.0           # after warm-up
        self.wait_s = 0.0            # after warm-up
        self.counted = 0
        self._window: list[tuple[float, float, int]] = []

    def record(self, wait_s: float, step_s: float, samples: int, fetch_cpu_s: float = 0.0) -> float:
        """Count one step (``fetch_cpu_s``: CPU time this thread spent inside the wait, receiving the
        batch); returns the seconds the advisor took (not part of any step)."""
        self.steps += 1
        self._window.append((wait_s, step_s, samples))
        if self.steps > self.warmup:
            self.counted += 1
            self.samples += samples
            self.total_s += step_s
            self.wait_s += wait_s
        if self.steps % self.log_every == 0:
            waits, totals, counts = zip(*self._window)
            elapsed = max(sum(totals), 1e-12)
            log.info("%s", window_line(self.label, self.steps, sum(totals) / len(totals), len(totals),
                                       sum(waits) / elapsed, sum(counts) / elapsed))
            self._window.clear()
        if self.advisor is None:
            return 0.0
        started = time.perf_counter()
        self.advisor.on_step(self.steps, wait_s, step_s, fetch_cpu_s)
        advice = self.advisor.last
        if self.autoscaler is not None and advice is not None and advice is not self._advised:
            self._advised = advice
            advice["autoscale"] = self.autoscaler.on_advice(advice)
        return time.perf_counter() - started

    def summary(self) -> dict[str, Any]:
        timed = self.total_s > 0
        out = StepFigures(self.steps, min(self.warmup, self.steps), self.total_s / self.counted if self.counted else None,
                          self.wait_s / self.total_s if timed else None,
                          self.samples / self.total_s if timed else None).to_json()
        if self.advisor is not None:
            out["advice"] = self.advisor.final(self.steps)
            self.advisor = None  # asked once: the servers' channels are closed
        if self.autoscaler is not None:  # the end of training changes no node: the decisions so far
            self.autoscaler.close()
            if out.get("advice") is not None:
                out["advice"] = dict(out["advice"], autoscale=self.autoscaler.summary())
            self.autoscaler = None
        return out


class StepTimer:
    """Wraps a batch iterator: measures how long each ``next()`` blocks."""

    def __init__(self, stats: StepStats) -> None:
        self.stats = stats
        self._last_end = time.perf_counter()
        self._wait = 0.0
        self._fetch_cpu = 0.0

    def restart(self) -> None:
        """Call when a new epoch starts (epoch set-up is not a step)."""
        self._last_end = time.perf_counter()

    def fetch(self, iterator):
        start, cpu = time.perf_counter(), time.thread_time()
        batch = next(iterator)
        self._wait = time.perf_counter() - start
        self._fetch_cpu = time.thread_time() - cpu
        return batch

    def done(self, samples: int) -> None:
        end = time.perf_counter()
        advising = self.stats.record(self._wait, end - self._last_end, samples, self._fetch_cpu)
        self._last_end = end + advising  # the advisor's calls are not part of the next step


def job_metrics(rank_summaries: list[dict], base: dict[str, Any]) -> dict[str, Any]:
    """Combine every rank's summary into the job's metrics (rank 0's view); rank 0's
    end-of-training advice becomes the job's ``advice``."""
    advice = next((r.get("advice") for r in rank_summaries if r.get("advice") is not None), None)
    rank_summaries = [{k: v for k, v in r.items() if k != "advice"} for r in rank_summaries]
    ranks = [StepFigures.from_json(r) for r in rank_summaries]
    avgs = [r.avg_step_time_s for r in ranks if r.avg_step_time_s is not None]
    waits = [r.data_wait_fraction for r in ranks if r.data_wait_fraction is not None]
    rates = [r.samples_per_s for r in ranks if r.samples_per_s is not None]
    nodes: dict[str, dict] = {}
    for r in rank_summaries:
        nodes.setdefault(r["host"], {"host": r["host"], "role": base.get("mode_role", "dnn"), "ranks": []})
        nodes[r["host"]]["ranks"].append(r)
    out = {k: v for k, v in base.items() if k != "mode_role"}
    if advice is not None:
        out["advice"] = advice
    first = ranks[0] if ranks else StepFigures()
    # the slowest rank sets the pace
    out.update(StepFigures(first.steps, first.warmup_steps_discarded, max(avgs) if avgs else None,
                           max(waits) if waits else None, sum(rates) if rates else None).to_json(),
               total_steps=sum(r.steps for r in ranks), nodes=list(nodes.values()) + list(base.get("nodes", [])))
    return out
