"""CPU busy share of each emulated node, and CPU lists, for the step-time benchmark.

Every emulated node of ``hetero local`` is a child process of the benchmark, started with
the node's ``SM_CURRENT_HOST`` in its environment and pinned to its own CPUs (its workers
inherit the affinity). :class:`NodeCpuMonitor` samples the CPU time of each node's whole
process tree with psutil: a live process counts its own user + system time plus that of the
children it has already reaped, so workers that have exited are not lost. A node's *busy
share* is its CPU seconds divided by (wall seconds x CPUs it is pinned to): 1.0 means its
cores never idled. Whole-machine per-core busy shares are sampled too: a core busier than
the node pinned on it means another process (another user's tests) ran there.
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import cast

import psutil

log = logging.getLogger(__name__)


def parse_cpu_list(text: str) -> list[int]:
    """``"0"``, ``"0,2"`` or ``"1-3"`` -> sorted CPU ids, as ``hetero local --dnn-cpus`` reads them.

    Raises:
        ValueError: malformed or empty list, or CPUs this process may not use (naming the usable ones).
    """
    from hetero.local.tree import parse_cpus

    cpus = parse_cpus(text)
    if not cpus:
        raise ValueError(f"CPU list {text!r} is empty")
    return sorted(cpus)


def cpu_list_text(cpus: list[int]) -> str:
    """[0, 1, 2] -> "0,1,2" (the form ``hetero local --dnn-cpus`` accepts)."""
    return ",".join(str(c) for c in cpus)


def _tree_cpu_s(proc: psutil.Process) -> float:
    """User + system seconds of ``proc`` and its live descendants, plus what they reaped."""
    total = 0.0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue  # exited between listing and reading
    return total


@dataclass
class NodeUsage:
    """CPU figures of one node over the time it was seen."""

    host: str
    role: str
    cpus: list[int]
    first_s: float
    last_s: float = 0.0
    cpu_s: float = 0.0
    first_cpu_s: float = 0.0
    intervals: list[float] = field(default_factory=list)  # busy share per sampling interval
    series: list[tuple[float, float]] = field(default_factory=list)  # (wall clock, CPU seconds) per sample

    def cpu_at(self, when: float) -> float | None:
        """CPU seconds of the node's tree at wall-clock time ``when``, interpolated between samples."""
        pts = self.series
        if not pts or when < pts[0][0] or when > pts[-1][0]:
            return None
        for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
            if t0 <= when <= t1:
                return c0 + (c1 - c0) * ((when - t0) / (t1 - t0) if t1 > t0 else 1.0)
        return pts[-1][1]

    def summary(self) -> dict:
        wall = max(self.last_s - self.first_s, 1e-9)
        n = max(1, len(self.cpus))
        return {"host": self.host, "role": self.role, "cpus": self.cpus, "wall_s": round(wall, 3),
                "cpu_s": round(self.cpu_s - self.first_cpu_s, 3),
                "busy_share": (self.cpu_s - self.first_cpu_s) / (wall * n),
                "busy_share_median": statistics.median(self.intervals) if self.intervals else None}


class NodeCpuMonitor:
    """Samples, in a thread, the CPU time of every child process that is an emulated node.

    Args:
        interval_s: sampling period.
        root: process whose children are the nodes (default: this one).

    Use as a context manager around ``run_local``; then :meth:`summary`.
    """

    def __init__(self, interval_s: float = 0.5, root: psutil.Process | None = None) -> None:
        self.interval_s = interval_s
        self.root = root or psutil.Process()
        self.nodes: dict[int, NodeUsage] = {}
        self.core_busy: dict[int, float] = {}
        self.core_series: list[tuple[float, list[float]]] = []  # (wall clock, each core's busy seconds) per sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="node-cpu-monitor", daemon=True)
        self._cores_start: list | None = None  # each core's times at __enter__

    def __enter__(self) -> "NodeCpuMonitor":
        self._cores_start = psutil.cpu_times(percpu=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5.0)
        end = psutil.cpu_times(percpu=True)
        for cpu, (a, b) in enumerate(zip(cast(list, self._cores_start), end)):
            total = sum(b) - sum(a)
            idle = (b.idle + getattr(b, "iowait", 0.0)) - (a.idle + getattr(a, "iowait", 0.0))
            self.core_busy[cpu] = 1.0 - idle / total if total > 0 else 0.0

    def _identify(self, proc: psutil.Process) -> NodeUsage | None:
        try:
            env = proc.environ()
            cpus = sorted(proc.cpu_affinity())
        except psutil.Error:
            return None
        host = env.get("SM_CURRENT_HOST")  # none: not an emulated node
        return NodeUsage(host, env.get("SM_CURRENT_INSTANCE_GROUP", ""), cpus, time.monotonic()) if host else None

    def sample(self) -> None:
        """Take one sample now (the thread calls this every ``interval_s``)."""
        try:
            children = self.root.children(recursive=False)
        except psutil.Error:
            return
        now = time.monotonic()
        self.core_series.append((time.time(), [sum(t) - t.idle - getattr(t, "iowait", 0.0)
                                               for t in psutil.cpu_times(percpu=True)]))
        for proc in children:
            usage = self.nodes.get(proc.pid)
            if usage is None:
                usage = self._identify(proc)
                if usage is None:
                    continue
                self.nodes[proc.pid] = usage
                usage.first_cpu_s = usage.cpu_s = _tree_cpu_s(proc)
                usage.last_s = now
                usage.series.append((time.time(), usage.cpu_s))
                continue
            cpu = max(usage.cpu_s, _tree_cpu_s(proc))  # a reaped tree must not count backwards
            if now > usage.last_s:
                usage.intervals.append((cpu - usage.cpu_s) / ((now - usage.last_s) * max(1, len(usage.cpus))))
            usage.cpu_s, usage.last_s = cpu, now
            usage.series.append((time.time(), cpu))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def others_between(self, t0: float, t1: float) -> dict[int, float]:
        """Each core's share of the wall-clock span ``t0``..``t1`` that processes other than the
        nodes used (its busy share less the nodes' CPU on it; a node's CPU split evenly over its
        cores). Empty when the samples do not span it."""
        inside = [(t, busy) for t, busy in self.core_series if t0 <= t <= t1]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return {}
        (a, first), (b, last) = inside[0], inside[-1]
        ours = [0.0] * len(first)
        for usage in self.nodes.values():
            c0, c1 = usage.cpu_at(a), usage.cpu_at(b)
            if c0 is None or c1 is None or not usage.cpus:
                continue
            for cpu in usage.cpus:
                if cpu < len(ours):
                    ours[cpu] += (c1 - c0) / len(usage.cpus)
        return {cpu: min(1.0, max(0.0, (last[cpu] - first[cpu] - ours[cpu]) / (b - a))) for cpu in range(len(first))}

    def summary(self) -> list[dict]:
        """Per node: host, role (instance group), CPUs, wall and CPU seconds, busy shares."""
        return [u.summary() for u in sorted(self.nodes.values(), key=lambda u: u.host)]


def cores_busy(cpus: list[int], window_s: float = 2.0) -> float:
    """Mean busy share of ``cpus`` (all processes, anyone's) over the next ``window_s`` seconds."""
    shares = psutil.cpu_percent(interval=window_s, percpu=True)
    return sum(shares[c] for c in cpus) / (100.0 * len(cpus))


def wait_for_quiet(cpus: list[int], threshold: float, timeout_s: float, window_s: float = 2.0) -> tuple[float, float]:
    """Wait until other processes leave ``cpus`` mostly idle (busy share < ``threshold``).

    Call it while nothing of the benchmark runs: every busy cycle is then someone else's.

    Returns:
        (seconds waited, last busy share seen); gives up after ``timeout_s`` (logged).
    """
    start = time.monotonic()
    busy = cores_busy(cpus, window_s)
    while busy >= threshold and time.monotonic() - start < timeout_s:
        busy = cores_busy(cpus, window_s)
    waited = time.monotonic() - start
    if busy >= threshold:
        log.warning("CPUs %s still %.0f%% busy with other processes after %.0fs; running anyway", cpus,
                    100 * busy, waited)
    return waited, busy


def foreign_share(nodes: list[dict], core_busy: dict[int, float], cpus: list[int]) -> float | None:
    """Share of ``cpus``' time used by processes other than the benchmark's nodes during a run.

    Args:
        nodes: :meth:`NodeCpuMonitor.summary` of the run. core_busy: its per-core busy shares.
        cpus: the cores the run's nodes were pinned to.
    """
    if not nodes or not cpus:
        return None
    wall = max(n["wall_s"] for n in nodes)
    ours = sum(n["cpu_s"] for n in nodes) / (wall * len(cpus))
    total = sum(core_busy.get(c, 0.0) for c in cpus) / len(cpus)
    return max(0.0, total - ours)
