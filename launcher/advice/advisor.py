"""Rank 0's live advice: every ``advice_every`` steps and at the end, how many data nodes to add.

:class:`LiveAdvisor` sits in rank 0's :class:`launcher.train.step_stats.StepStats`. After the warm-up it
takes a snapshot of every data server's counters (the authenticated ``GetStats`` call the DNN
node already uses for ``metrics.json``); every ``advice_every`` steps it takes another, turns the
differences into each server's batches/s and workers' busy share over the window, pairs them with
the window's mean step time and data wait, and logs :func:`launcher.advice.model.advise`'s answer as an
advice line (``launcher.metric_lines.advice_line``, read by the job's ``MetricDefinitions``). The
end-of-training advice goes into ``metrics.json`` under ``advice``, the advice lines before it
under ``advice.history``.

Each ``GetStats`` call has a deadline (``stats_timeout_s``); a server that does not answer is left
out of that window and named in a warning, and training goes on.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from ..metric_lines import advice_line
from .model import LiveFigures, ServerFigures, advise, steps_per_epoch

log = logging.getLogger(__name__)

ServerList = Callable[[], Sequence[tuple[str, bool]]]   # -> [(address, is a data node)]


HISTORY_KEYS = ("step", "change", "data_nodes", "predicted_step_s", "step_s", "data_wait_fraction")
HISTORY_KEEP = 100       # advice lines kept for metrics.json
TRUSTED_UPTIME_S = 60.0  # a server's busy share is differenced only once it has been up this long


@dataclass(frozen=True)
class Snapshot:
    """One server's cumulative counters at one moment."""

    uptime_s: float
    batches_sent: int
    busy_fraction: float
    batches_built: int = 0
    bytes_sent: int = 0


def window_figures(address: str, before: Snapshot | None, after: Snapshot, data_node: bool,
                   span_s: float | None = None) -> ServerFigures:
    """A server's batches/s, busy share and batches built per second between two snapshots.

    The server reports its workers' busy share since they started, which is after its own clock
    started (they load the pipeline first): differencing it over a window is off by up to that
    load time over the server's uptime, so for a server up less than :data:`TRUSTED_UPTIME_S`
    (and one that joined or restarted since ``before``) the busy share is left unknown and the
    advice takes what it delivered as its capacity.

    Args:
        span_s: the window's length as the trainer timed it (its steps' total): the batches/s are
            taken over it, so the time between the last step and a snapshot taken later (the end of
            training) does not dilute them. None: the server's own uptime between the snapshots.
    """
    if before is None or after.uptime_s <= before.uptime_s or after.batches_sent < before.batches_sent:
        return ServerFigures(address, after.batches_sent / max(after.uptime_s, 1e-9), None, data_node, new=True)
    uptime = after.uptime_s - before.uptime_s
    span = span_s if span_s and span_s > 0 else uptime
    sent = (after.batches_sent - before.batches_sent) / span
    if before.uptime_s < TRUSTED_UPTIME_S:
        return ServerFigures(address, sent, None, data_node)
    busy = (after.busy_fraction * after.uptime_s - before.busy_fraction * before.uptime_s) / uptime
    return ServerFigures(address, sent, min(1.0, max(0.0, busy)), data_node,
                         built_per_s=(after.batches_built - before.batches_built) / uptime)


def window_bytes_per_batch(before: Mapping[str, Snapshot], after: Mapping[str, Snapshot],
                           kinds: Mapping[str, bool]) -> float | None:
    """Bytes the data nodes sent per batch between two snapshots (what crosses their NICs); None
    without a batch sent by a data node present in both."""
    sent_bytes = sent_batches = 0
    for address, now in after.items():
        then = before.get(address)
        if not kinds.get(address, True) or then is None or now.batches_sent <= then.batches_sent:
            continue
        if now.bytes_sent > then.bytes_sent:
            sent_bytes += now.bytes_sent - then.bytes_sent
            sent_batches += now.batches_sent - then.batches_sent
    return sent_bytes / sent_batches if sent_batches else None


def scaled_to_consumption(servers: list[ServerFigures], consumed_per_s: float) -> tuple[ServerFigures, ...]:
    """The servers' batches/s scaled so they add up to what the ranks consumed (``ranks / step``).

    A server's counter runs ahead of the ranks by the batches in flight and held (up to a window
    per server and consumer); that lead grows as an epoch starts and drains as it ends, which would
    skew a window's deltas. The ranks' consumption is exact, so the servers' deltas only give
    their shares of it.
    """
    total = sum(s.batches_per_s for s in servers if not s.new)
    target = consumed_per_s - sum(s.batches_per_s for s in servers if s.new)  # a new one's figure stays
    if total <= 0 or target <= 0:
        return tuple(servers)
    return tuple(s if s.new else replace(s, batches_per_s=s.batches_per_s * target / total) for s in servers)


class LiveAdvisor:
    """Live advice for one job, fed by rank 0's step timings.

    Args:
        servers: returns the current data servers as ``(address, is a data node)`` pairs.
        token: the job token (for ``GetStats``).
        ranks: the job's world size.
        every: advise every this many steps (after ``warmup`` steps).
        warmup: steps left out before the first snapshot.
        data_instance, dnn_instance, dnn_count: what the job runs on, for the costs.
        prices: instance type -> $/h (the ``advice_prices`` hyperparameter).
        stats_timeout_s: deadline of each ``GetStats`` / ``Hello`` call.
        registry: the job's registry URI ("" : none): servers registered there with the job token's
            proof and the job's pipeline also count, as data nodes (a server the fixed list already
            names, by its server id, counts once).
        network: instance type -> NIC baseline Gbps (the ``advice_network`` hyperparameter): with the
            bytes per batch the servers send, the advice counts the NICs and names what binds.
        flow_gbps: one flow's cap (None: not limited).
        client: ``ControlClient``-like factory ``(address, token, client_id)`` (tests pass a fake).
    """

    def __init__(self, servers: ServerList, token: str, ranks: int, every: int, warmup: int = 0,
                 data_instance: str = "", dnn_instance: str = "", dnn_count: int = 1,
                 prices: Mapping[str, float] | None = None, stats_timeout_s: float = 2.0,
                 registry: str = "", client: Callable[..., Any] | None = None,
                 network: Mapping[str, float] | None = None, flow_gbps: float | None = None) -> None:
        if client is None:
            from dnn_worker import ControlClient
            client = ControlClient
        self._servers, self._token, self._client = servers, token, client
        self.ranks, self.every, self.warmup = ranks, every, warmup
        self.data_instance, self.dnn_instance, self.dnn_count = data_instance, dnn_instance, dnn_count
        self.prices = dict(prices or {})
        self.network = dict(network or {})
        self.flow_gbps = flow_gbps
        self._batch_size = 0
        self.timeout_s = stats_timeout_s
        self._steps_per_epoch: int | None = None
        self._base: dict[str, Snapshot] | None = None
        self._window: list[tuple[float, float, float]] = []   # (wait_s, step_s, fetch_cpu_s) since the base
        self._prev: tuple[dict[str, Snapshot], list[tuple[float, float, float]]] | None = None
        self.registry = registry
        self._kinds: list[tuple[str, bool]] = []
        self._clients: dict[str, Any] = {}
        self._ids: dict[str, str] = {}          # address -> server id (from Hello)
        self._fingerprint: str | None = None
        self._registered_last: list[tuple[str, bool]] = []
        self.last: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []

    # -- fed by StepStats ------------------------------------------------------------------------
    def on_step(self, steps: int, wait_s: float, step_s: float, fetch_cpu_s: float = 0.0) -> None:
        """Record step ``steps`` (1-based; ``fetch_cpu_s``: CPU time of the wait spent receiving);
        snapshot after the warm-up, advise every ``every``."""
        if steps <= self.warmup:
            if steps == self.warmup:
                self._base = self._snapshot()
            return
        if self._base is None:  # no warm-up: the first step's snapshot starts the window
            self._base = self._snapshot()
            return
        self._window.append((wait_s, step_s, fetch_cpu_s))
        if self.every and steps % self.every == 0:
            now = self._snapshot()
            self._emit(steps, self._base, self._window, now, final=False)
            self._prev = (self._base, self._window)
            self._base, self._window = now, []

    def final(self, steps: int) -> dict[str, Any] | None:
        """The end-of-training advice (over the last window, joined to the one before when it is
        short), logged and returned; None when no step was timed after the warm-up."""
        base, window = self._base, self._window
        if self._prev is not None and len(window) < max(1, self.every // 2):
            base, window = self._prev[0], self._prev[1] + window
        try:
            if base is None or not window:
                return self.last
            return self._emit(steps, base, window, self._snapshot(), final=True)
        finally:
            self.close()

    def close(self) -> None:
        """Close the control channels to the servers."""
        for ctl in self._clients.values():
            ctl.close()
        self._clients.clear()

    # -- internals -------------------------------------------------------------------------------
    def _emit(self, steps: int, base: dict[str, Snapshot], window: list[tuple[float, float, float]],
              now: dict[str, Snapshot], final: bool) -> dict[str, Any] | None:
        kinds = dict(self._kinds)
        span = sum(w[1] for w in window)
        step_s = span / len(window)
        servers = scaled_to_consumption(
            [window_figures(a, base.get(a), s, kinds.get(a, True), span) for a, s in now.items()], self.ranks / step_s)
        wait_s = sum(w[0] for w in window) / len(window)
        fetch_cpu_s = sum(w[2] for w in window) / len(window)
        try:
            advice = advise(LiveFigures(step_s, wait_s, self.ranks, servers, self._steps_per_epoch,
                                        self.data_instance, self.dnn_instance, self.dnn_count, fetch_cpu_s,
                                        bytes_per_batch=window_bytes_per_batch(base, now, kinds),
                                        data_nic_gbps=self.network.get(self.data_instance),
                                        dnn_nic_gbps=self.network.get(self.dnn_instance),
                                        flow_gbps=self.flow_gbps, batch_size=self._batch_size),
                            self.prices)
        except ValueError as exc:
            log.warning("no advice at step %d: %s", steps, exc)
            return None
        out = dict(advice.to_dict(), step=steps, window_steps=len(window), final=final,
                   servers=[{"address": s.address, "batches_per_s": s.batches_per_s,
                             "busy_fraction": s.busy_fraction, "data_node": s.data_node} for s in servers])
        log.info("%s", advice_line(steps, out, final=final))
        self.history = (self.history + [{k: out[k] for k in HISTORY_KEYS}])[-HISTORY_KEEP:]
        if final:  # metrics.json: the end-of-training advice and the latest periodic ones before it
            out["history"] = list(self.history)
        self.last = out
        return out

    def _registered(self, known: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
        """Servers in the registry that prove the job token and serve the job's pipeline, not
        already in ``known``."""
        from data_service.membership.registry import verified_entries

        try:
            entries, _ = verified_entries(self.registry, self._token, self._fingerprint, timeout_s=self.timeout_s)
        except Exception as exc:  # the consumers keep the servers they have: so does the advice
            log.warning("advice: registry %s not read (%s); advising from the servers known so far",
                        self.registry, exc)
            return self._registered_last
        addresses = {a for a, _ in known}
        ids = {self._ids.get(a) for a in addresses}
        self._registered_last = [(e.address, True) for e in entries
                                 if e.address not in addresses and e.server_id not in ids]
        return self._registered_last

    def _snapshot(self) -> dict[str, Snapshot]:
        started = time.monotonic()
        kinds = list(self._servers())
        snap = self._poll(kinds)
        if self.registry:  # after the fixed servers' Hello: their server ids are known
            more = self._registered(kinds)
            snap.update(self._poll(more))
            kinds += more
        self._kinds = kinds
        log.debug("advice snapshot of %d server(s) in %.3f s", len(snap), time.monotonic() - started)
        return snap

    def _poll(self, kinds: list[tuple[str, bool]]) -> dict[str, Snapshot]:
        if not kinds:
            return {}
        with ThreadPoolExecutor(max_workers=min(16, len(kinds))) as pool:
            got = list(pool.map(self._one, [a for a, _ in kinds]))
        return {a: s for (a, _), s in zip(kinds, got) if s is not None}

    def _one(self, address: str) -> Snapshot | None:
        try:
            ctl = self._clients.get(address)
            if ctl is None:  # one channel per server for the whole run: a snapshot costs one call each
                ctl = self._clients[address] = self._client(address, self._token, "advisor")
            if address not in self._ids:
                hello = ctl.hello(timeout=self.timeout_s)
                self._ids[address] = hello.server_id
                info = hello.dataset
                if self._steps_per_epoch is None:
                    self._batch_size = int(info.batch_size)
                    self._fingerprint = info.fingerprint or None
                    self._steps_per_epoch = steps_per_epoch(info.num_samples, info.batch_size, info.drop_last,
                                                            self.ranks)
            s = ctl.stats(timeout=self.timeout_s)
            return Snapshot(float(s.uptime_s), int(s.batches_sent), float(s.worker_busy_fraction),
                            int(s.batches_built), int(getattr(s, "bytes_sent", 0)))
        except Exception as exc:  # advice is informative: training goes on without this server's figures
            dropped = self._clients.pop(address, None)
            if dropped is not None:
                dropped.close()
            log.warning("advice: no stats from data server %s within %.1f s (%s: %s); it is left out of this "
                        "window", address, self.timeout_s, type(exc).__name__, exc)
            return None


def live_advisor(job, rank: int) -> LiveAdvisor | None:
    """The advisor of a heterogeneous job's rank 0 (``advice_every`` > 0), else None.

    Args:
        job: the rank's ``launcher.train.trainer.TrainJob``.
        rank: the global rank.
    """
    cfg = job.cfg
    every = int(cfg.advice.advice_every or 0)
    if rank != 0 or job.mode != "heterogeneous" or every <= 0 or not job.servers:
        return None
    own = {a for h, a in zip(job.server_hosts, job.servers) if h in job.dnn_hosts}
    fixed = [(a, a not in own) for a in job.servers]

    def servers() -> list[tuple[str, bool]]:
        return fixed

    network = dict(cfg.advice.advice_network or {})
    # the flow cap is an EC2 figure: a job given no NIC figures (hetero local, loopback) is not held to it
    flow = float(cfg.advice.advice_flow_gbps or 0.0) if network else 0.0
    return LiveAdvisor(servers, job.token, job.world_size, every, cfg.train.warmup_steps,
                       data_instance=job.extra.get("data_instance_type", ""),
                       dnn_instance=job.extra.get("dnn_instance_type", ""), dnn_count=len(job.dnn_hosts),
                       prices=dict(cfg.advice.advice_prices or {}),
                       registry=str(cfg.elastic.registry or ""),
                       network=network, flow_gbps=flow or None)
