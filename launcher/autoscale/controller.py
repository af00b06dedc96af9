"""The autoscaler: the live advice in, the policy's decision out, acted on and logged.

:class:`Autoscaler` sits beside rank 0's live advisor (``launcher/advice/advisor.py``). Each periodic
advice becomes a :class:`~launcher.autoscale.policy.Demand`; the policy's decision is logged at
once as an ``autoscale`` line with its figures (``launcher.metric_lines.autoscale_line``, read by
the job's ``MetricDefinitions`` and ``hetero stats``) and kept for ``metrics.json``; in mode
``act`` it is carried out on a thread of its own, so the step never waits on an actuator:

* **out**: the actuator starts ``count`` data nodes that join the registry;
* **in**: the newest servers that joined through the registry (never the job's own data nodes)
  are drained (the authenticated ``Shutdown``: a joined server removes its registry entry first,
  finishes what it owes, then stops; the consumers ask it for nothing more, so every batch is
  trained once), then, once they left the registry, the actuator releases their nodes.

The policy's state, what was started and drained, and the latest decisions are saved beside the
registry after every decision (``launcher.autoscale.state``) and read at start: a rank 0 that
restarts, or a job resumed from its checkpoint, keeps its cooldown and promised nodes.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence, cast

from data_service.errors import ConfigError
from data_service.membership.registry import Entry, RegistryError, verified_entries

from ..metric_lines import autoscale_line
from .actuators import Actuator, DrainingActuator, PartialScaleOut, ScaleContext
from .policy import HOLD, IN, OUT, Demand, State, decide
from .settings import Settings
from .state import HISTORY_KEEP, StateStore

log = logging.getLogger(__name__)

Drainer = Callable[[str, str, float], None]  # (address, token, grace_s): ask the server to leave


def drain_server(address: str, token: str, grace_s: float) -> None:
    """Ask ``address`` to leave (a joined server unregisters first, then finishes what it owes)."""
    from dnn_worker.transport.control import ControlClient

    with ControlClient(address, token, "autoscale") as ctl:
        ctl.shutdown(grace_s=grace_s, reason="autoscale: drained", timeout=10.0)


class Autoscaler:
    """See the module docstring.

    Args:
        settings: the checked ``autoscale.*`` settings.
        actuator: what adds and releases nodes (None in mode ``advise``: decisions are logged only).
        registry: the job's registry URI.
        token: the job token (to read the registry and drain servers).
        fixed: addresses of the job's own data servers (never drained).
        store: where the state is saved (default: beside the registry).
        clock: wall-clock seconds (tests pass a fake).
        drainer: asks one server to leave (tests may pass another).
        drain_by_actuator: scale in through the actuator's ``drain(count, ctx)`` (ids it stopped)
            instead of draining registered servers here: a controller outside the job's network
            (``hetero autoscale JOB --act``) stops the data-only jobs it started, whose servers
            leave the registry first as on any SIGTERM.
    """

    def __init__(self, settings: Settings, actuator: Actuator | None, registry: str, token: str, *,
                 fixed: Sequence[str] = (), store: StateStore | None = None,
                 clock: Callable[[], float] = time.time, drainer: Drainer = drain_server,
                 drain_by_actuator: bool = False) -> None:
        self.settings, self.actuator, self.registry, self.token = settings, actuator, registry, token
        self.fixed = set(fixed)
        self.clock, self.drainer, self.drain_by_actuator = clock, drainer, drain_by_actuator
        self.store = store if store is not None else (StateStore(registry) if registry else None)
        saved = self.store.load() if self.store is not None else {}
        self.state = State.from_dict(saved.get("policy", {}))
        self.started: list[str] = list(saved.get("started", []))
        self.drained: list[str] = list(saved.get("drained", []))
        self.history: list[dict[str, Any]] = list(saved.get("history", []))[-HISTORY_KEEP:]
        self.resumed = bool(saved)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autoscale")
        self._pending: list[Future] = []
        if saved and self.store is not None:  # saved: read from the store
            log.info("autoscale: resumed from %s (%d decision(s) taken, last %s)", self.store.url,
                     self.state.decisions, self.state.last_action or "none")

    def check_start(self, nodes: int, node_usd_per_hour: float | None, instance_type: str = "") -> None:
        """The job's starting data group fits the limits, and a $/h cap has a price to apply.

        Raises:
            ConfigError: the group costs more than the cap, or a cap with no price for
                ``instance_type`` (the policy could not tell what the cap pays for); each names the fix.
        """
        try:
            self.settings.limits.check_group(nodes, node_usd_per_hour, instance_type)
        except ValueError as exc:
            text = str(exc).replace("usd_per_hour=", "autoscale.usd_per_hour=")
            raise ConfigError(f"autoscale: {text}") from None

    def on_advice(self, advice: Mapping[str, Any]) -> dict[str, Any] | None:
        """Decide on one periodic advice (``Advice.to_dict()`` with ``step``), log it, act in mode
        ``act``; returns the decision's figures (None when the advice could not be read: logged,
        training goes on)."""
        try:
            return self._on_advice(advice)
        except Exception:  # noqa: BLE001 - the autoscaler never stops the training it sizes
            log.exception("autoscale: no decision on the advice at step %s", advice.get("step"))
            return None

    def _on_advice(self, advice: Mapping[str, Any]) -> dict[str, Any]:
        demand = Demand.from_advice(advice)
        now = self.clock()
        with self._lock:
            decision, self.state = decide(demand, self.settings.limits, self.state, now)
            figures = dict(decision.figures(), time=now, mode=self.settings.mode,
                           usd_per_hour=(None if demand.node_usd_per_hour is None
                                         else decision.target * demand.node_usd_per_hour))
            self.history = (self.history + [figures])[-HISTORY_KEEP:]
            self._save()
        log.info("%s", autoscale_line(figures))
        if decision.action != HOLD and self.settings.acting and self.actuator is not None:
            ctx = ScaleContext(self.registry, decision.nodes, decision.target, decision.reason, figures)
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._pool.submit(self._act, decision.action, decision.count, ctx))
        return figures

    def summary(self) -> dict[str, Any]:
        """For metrics.json: the settings, the decisions (latest last) and what was started and drained."""
        with self._lock:
            actions = [h for h in self.history if h["action"] != HOLD]
            return {"settings": self.settings.describe(), "decisions": list(self.history),
                    "actions": len(actions), "started": list(self.started), "drained": list(self.drained),
                    "state": self.state.to_dict(), "resumed": self.resumed}

    def wait(self, timeout: float = 60.0) -> None:
        """Wait (up to ``timeout``) for the actions under way."""
        end = time.monotonic() + timeout
        for f in self._pending:
            try:
                f.result(timeout=max(0.0, end - time.monotonic()))
            except Exception as exc:  # noqa: BLE001 - logged: the job's end is not an autoscaler error
                log.warning("autoscale: an action did not finish: %s", exc)
        self._pending = [f for f in self._pending if not f.done()]

    def close(self, timeout: float = 60.0) -> None:
        """Wait (up to ``timeout``) for an action under way, then stop."""
        self.wait(timeout)
        self._pool.shutdown(wait=False)
        if self.actuator is not None:
            self.actuator.close()

    # -- acting (the autoscale thread) ------------------------------------------------------------
    def _act(self, action: str, count: int, ctx: ScaleContext) -> None:
        actuator = cast(Actuator, self.actuator)  # _on_advice acts only with an actuator
        try:
            if action == OUT:
                try:
                    ids = actuator.scale_out(count, ctx)
                except PartialScaleOut as exc:
                    self._record_started(exc.created, missing=exc.asked - len(exc.created))
                    raise
                self._record_started(ids)
                log.info("autoscale: started %d data node(s) (%s) joining %s", len(ids), ", ".join(ids), self.registry)
            elif action == IN and self.drain_by_actuator:
                stopped = cast(DrainingActuator, actuator).drain(count, ctx)  # drain_by_actuator: one that drains
                with self._lock:
                    self.drained += stopped
                    self._not_draining(count - len(stopped))
                    self._save()
                log.info("autoscale: stopped %d data node(s) (%s); each leaves the registry first", len(stopped),
                         ", ".join(stopped))
            elif action == IN:
                drained = self._drain(count)
                if drained:
                    actuator.scale_in(drained, ctx)
        except Exception:  # noqa: BLE001 - the job goes on; the next advice decides again
            log.exception("autoscale: scale-%s of %d failed", action, count)

    def _record_started(self, ids: Sequence[str], missing: int = 0) -> None:
        """Keep ``ids`` to release later; ``missing`` nodes of the scale-out never started, so the
        policy stops waiting for them rather than holding until its join timeout."""
        with self._lock:
            self.started += ids
            if missing and self.state.promised is not None:
                self.state = replace(self.state, promised=max(0, self.state.promised - missing))
            self._save()

    def _not_draining(self, missing: int) -> None:
        """``missing`` nodes of the drain were not asked to leave: the policy counts them as serving
        again rather than waiting for them until its drain timeout (caller holds the lock)."""
        if missing > 0 and self.state.draining is not None:
            self.state = replace(self.state, draining=self.state.draining + missing)

    def victims(self, count: int) -> list[Entry]:
        """The ``count`` newest servers that joined through the registry (not the job's own)."""
        try:
            entries, _ = verified_entries(self.registry, self.token)
        except (RegistryError, OSError) as exc:
            log.warning("autoscale: cannot read registry %s to drain (%s)", self.registry, exc)
            return []
        joined = [e for e in entries if e.address not in self.fixed and e.server_id not in self.drained]
        return sorted(joined, key=lambda e: (e.started_at, e.server_id), reverse=True)[:count]

    def _drain(self, count: int) -> list[Entry]:
        chosen = self.victims(count)
        if len(chosen) < count:
            log.warning("autoscale: %d data node(s) to drain, %d joined through the registry can be (the job's own "
                        "data nodes are never drained)", count, len(chosen))
        asked = []
        for e in chosen:
            try:
                self.drainer(e.address, self.token, self.settings.drain_grace_s)
            except Exception as exc:  # noqa: BLE001 - one server that cannot be asked is named; others go on
                log.warning("autoscale: could not drain %s at %s: %s", e.server_id, e.address, exc)
                continue
            asked.append(e)
            with self._lock:
                self.drained.append(e.server_id)
                self._save()
            log.info("autoscale: draining data server %s at %s", e.server_id, e.address)
        if len(asked) < count:
            with self._lock:
                self._not_draining(count - len(asked))
                self._save()
        self._wait_left(asked)
        return asked

    def _wait_left(self, asked: list[Entry]) -> None:
        """Wait until the drained servers' entries are gone (deadline: their grace and 30 s)."""
        ids = {e.server_id for e in asked}
        deadline = time.monotonic() + self.settings.drain_grace_s + 30.0
        while ids and time.monotonic() < deadline:
            try:
                entries, _ = verified_entries(self.registry, self.token)
            except (RegistryError, OSError):  # an unreadable registry says nothing about who left
                time.sleep(0.5)
                continue
            ids &= {e.server_id for e in entries}
            if ids:
                time.sleep(0.5)
        if ids:
            log.warning("autoscale: drained server(s) %s still registered after %g s", sorted(ids),
                        self.settings.drain_grace_s + 30.0)

    def _save(self) -> None:
        if self.store is not None:
            self.store.save({"policy": self.state.to_dict(), "started": self.started[-HISTORY_KEEP:],
                             "drained": self.drained[-HISTORY_KEEP:], "history": self.history})
