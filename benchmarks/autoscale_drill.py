"""The autoscale drill: a local job sizes its own data group while its demand changes twice.

    python -m benchmarks.autoscale_drill [--sample-ms 5] [--steps 0.06,0.02,0.04] [--phase-s 60,90,90]

1. ``hetero local --autoscale`` runs a job with ONE data node, a registry folder and the local
   actuator (``hetero serve --join`` processes on this machine). Its pipeline
   (``examples.synthetic`` with ``sleep_ms``: wall time per sample without CPU, so every data node
   adds the same capacity even on a 2-core machine) serves one emulated rank.
2. The emulated step follows ``emulate_step_schedule``: a step one node keeps up with, then a
   shorter one (the job waits on data: the autoscaler adds nodes), then a longer one (the job has
   more than it needs: the autoscaler drains nodes).
3. The drill samples the registry (the data nodes serving) every 0.25 s and reads the advice and
   autoscale lines of rank 0's log. For each phase it reports the time from the step change until
   the node count is within one node of the phase's advised size for good (the goal), and until
   it is at that size for good, the overshoot (nodes added above the advised size and the count
   the phase started with), and the flaps (an out after an in, or an in after an out, within a
   phase).
4. It checks the count never exceeded ``max`` or what the $/h cap pays for, and compares the
   node-seconds paid (at the price given) with the cheapest fixed size meeting the shortest step
   (the ceiling of its demand over one node's measured capacity) over the job's ideal length.
5. When the job ends, its audit log is accounted against the epoch plan: every batch exactly once.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import cli, drill, report
from benchmarks.common.drill import LocalJob, windows

TOKEN = "autoscale-drill-token"
PRICE = 0.5  # $/h of one emulated data node
_LINE_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
_AUTOSCALE = re.compile(r"autoscale at step (\d+) .*?node change ([+-]?\d+) \((\w+); data nodes (\d+) -> (\d+), "
                        r"advised (\S+),")


def _stamp(line: str) -> float | None:
    m = _LINE_TIME.match(line)
    return drill.log_time(m.group(1)) if m else None


def decisions(log: Path) -> list[dict]:
    """(time, step, change, action, nodes, target, advised) of every autoscale line of ``log``."""
    out = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        m = _AUTOSCALE.search(line)
        if m:
            adv = m.group(6).rstrip(",")
            out.append({"t": _stamp(line), "step": int(m.group(1)), "change": int(m.group(2)), "action": m.group(3),
                        "nodes": int(m.group(4)), "target": int(m.group(5)),
                        "advised": None if adv == "n/a" else int(adv)})
    return out


class Census:
    """The data nodes serving (``own`` unregistered ones plus the registered ones), sampled on a thread."""

    def __init__(self, registry: Path, own: int = 0, every_s: float = 0.25) -> None:
        self.registry, self.own, self.every_s = registry, own, every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from data_service.membership.registry import RegistryError, verified_entries

        while not self._stop.wait(self.every_s):
            try:
                entries, _ = verified_entries(str(self.registry), TOKEN)
            except RegistryError:
                continue
            self.samples.append((time.time(), self.own + len(entries)))

    def start(self) -> "Census":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def node_seconds(self, start: float, end: float) -> float:
        total, prev = 0.0, None
        for t, n in self.samples:
            if prev is not None and t > start and prev[0] < end:
                total += prev[1] * (min(t, end) - max(prev[0], start))
            prev = (t, n)
        return total

    def between(self, start: float, end: float) -> list[tuple[float, int]]:
        return [(t, n) for t, n in self.samples if start <= t < end]


def phase_report(census: Census, acts: list[dict], start: float, end: float, advised: int) -> dict:
    """Convergence time, overshoot and flaps of one phase (``advised``: its last advised size)."""
    samples = census.between(start, end)
    converged = reached = None
    for t, n in samples:  # the first time from which on the count stays within one node / at the size
        converged = (t if converged is None else converged) if abs(n - advised) <= 1 else None
        reached = (t if reached is None else reached) if n == advised else None
    moves = [a["action"] for a in acts if start <= a["t"] < end and a["action"] in ("add", "drain")]
    flaps = sum(1 for a, b in zip(moves, moves[1:]) if a != b)
    peak = max((n for _, n in samples), default=0)
    return {"advised": advised, "converge_s": None if converged is None else round(converged - start, 1),
            "reach_s": None if reached is None else round(reached - start, 1),
            "overshoot": max(0, peak - max(advised, samples[0][1] if samples else 0)),
            "peak": peak, "final": samples[-1][1] if samples else None,
            "actions": moves, "flaps": flaps}


@dataclass(frozen=True)
class Plan:
    """The phases: each one's emulated step, its batches (its ideal length over its step) and first step."""

    steps: list[float]
    counts: list[int]

    @classmethod
    def parse(cls, steps: str, lengths: str) -> "Plan":
        """The plan of ``--steps`` and ``--phase-s`` (comma-separated seconds)."""
        step_s = [float(s) for s in steps.split(",")]
        return cls(step_s, [int(round(float(length) / step)) for step, length in zip(step_s, lengths.split(","))])

    @property
    def firsts(self) -> list[int]:
        """The first step of each phase."""
        return [sum(self.counts[:i]) for i in range(len(self.counts))]

    @property
    def total(self) -> int:
        """Batches of the whole job."""
        return sum(self.counts)

    @property
    def schedule(self) -> str:
        """``emulate_step_schedule``: the step each later phase starts with, at its first step."""
        return ",".join(f"{first}:{step}" for first, step in zip(self.firsts[1:], self.steps[1:]))

    @property
    def ideal_s(self) -> float:
        """The job's length were every step its emulated step."""
        return sum(c * s for c, s in zip(self.counts, self.steps))


@dataclass
class Run:
    """The job as it ran: the census of its data nodes, its wall clock, exit status and output."""

    census: Census
    started: float
    ended: float
    rc: int
    tail: str


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The drill's command line."""
    ap = cli.parser(__doc__)
    drill.add_job_options(ap)
    ap.add_argument("--steps", default="0.06,0.02,0.04", help="the emulated step of each phase, seconds")
    ap.add_argument("--phase-s", default="60,90,90", help="each phase's ideal length, seconds")
    ap.add_argument("--max", type=int, default=6)
    ap.add_argument("--usd-per-hour", type=float, default=3.0, help="the $/h cap on the data group")
    ap.add_argument("--cooldown-s", type=float, default=20.0)
    ap.add_argument("--in-after", type=int, default=3, help="advice windows in a row that say fewer before a drain")
    ap.add_argument("--advice-every", type=int, default=100)
    ap.add_argument("--converge-within-s", type=float, default=60.0, help="the stated time to converge")
    return ap.parse_args(argv)


def job_command(args: argparse.Namespace, plan: Plan, job: LocalJob) -> list[str]:
    """``hetero local --autoscale`` from one data node, with the phases' step schedule."""
    hps = job.hyperparameters(plan.steps[0], args.advice_every, PRICE, schedule=plan.schedule)
    scale = {"min": 1, "max": args.max, "usd_per_hour": args.usd_per_hour, "cooldown_s": args.cooldown_s,
             "in_after": args.in_after, "workers": 1, "ttl_s": 5}
    return job.command(hps, timeout=1200, extra=("--autoscale", *[f"{k}={v}" for k, v in scale.items()]))


def run_job(job: LocalJob, cmd: list[str]) -> Run:
    """Run the job to its end while a census samples the data nodes serving."""
    census = Census(job.registry, own=0).start()  # the job's own data node registers too
    started = time.time()
    proc = subprocess.Popen(cmd, env=job.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        tail = proc.communicate(timeout=1500)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        census.stop()
    return Run(census, started, time.time(), proc.returncode, tail)


def phases(run: Run, plan: Plan, log: Path, acts: list[dict]) -> list[dict]:
    """Each phase's report, bounded by the wall clock at which the trainer passed its first step."""
    wins = windows(log)  # (wall clock, last step, mean step) of each window line

    def step_time(step: int) -> float:  # wall clock when the trainer passed ``step``
        return next((t for t, s, _ in wins if s >= step), run.ended)

    trained = wins[-1][0] if wins else run.ended  # the last step: after it the job's end stops every server
    bounds = [step_time(f) if f else run.started for f in plan.firsts] + [trained]
    out = []
    for i, step in enumerate(plan.steps):
        start, end = bounds[i], bounds[i + 1]
        advised = [a["advised"] for a in acts if start <= a["t"] < end and a["advised"] is not None]
        out.append({"step_s": step, "start": round(start - run.started, 1), "length_s": round(end - start, 1),
                    **phase_report(run.census, acts, start, end, advised[-1] if advised else 1)})
    return out


def costs(args: argparse.Namespace, plan: Plan, run: Run, out: Path) -> dict:
    """$ paid for the data nodes against the cheapest fixed size that meets the shortest step, and
    the most nodes seen against what ``--max`` and the $/h cap allow."""
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").exists() else {}
    node_cap = (metrics.get("advice") or {}).get("node_capacity_per_s") or 1000 / (args.sample_ms * args.batch_size)
    fixed = max(1, math.ceil(max(1 / s for s in plan.steps) / node_cap - 1e-9))  # meets the shortest step
    paid = run.census.node_seconds(run.started, run.ended) * PRICE / 3600
    fixed_usd = fixed * plan.ideal_s * PRICE / 3600
    return {"node_cap": node_cap, "fixed": fixed, "paid": paid, "fixed_usd": fixed_usd,
            "cap_nodes": int(args.usd_per_hour / PRICE + 1e-9),
            "peak": max((n for _, n in run.census.samples), default=0)}


def print_report(args: argparse.Namespace, plan: Plan, run: Run, phase_rows: list[dict], cost: dict,
                 audit: dict) -> None:
    """Each phase's figures, the bounds, the $ against the fixed size, the job and its audit."""
    for i, p in enumerate(phase_rows):
        print(f"phase {i + 1}: step {p['step_s'] * 1000:.0f} ms from {p['start']} s for {p['length_s']} s: advised "
              f"{p['advised']} nodes; within one node of it after {p['converge_s']} s, at it after {p['reach_s']} s; "
              f"peak {p['peak']}, "
              f"overshoot {p['overshoot']}, final {p['final']}; actions {p['actions']}, flaps {p['flaps']}")
    print(f"never above max {args.max} / cap {cost['cap_nodes']} nodes: peak {cost['peak']}")
    print(f"$ paid {cost['paid']:.5f} (node-seconds at {PRICE} $/h) vs {cost['fixed_usd']:.5f} for {cost['fixed']} "
          f"fixed node(s) over the ideal {plan.ideal_s:.0f} s: ratio {cost['paid'] / cost['fixed_usd']:.2f} (node "
          f"capacity {cost['node_cap']:.1f} batches/s)")
    print(f"job exit {run.rc} after {run.ended - run.started:.0f} s; {drill.audit_line(audit, plan.total)}")


def passed(args: argparse.Namespace, run: Run, phase_rows: list[dict], cost: dict, audit: dict) -> bool:
    """A clean job and audit, never above the bounds, no flaps, every step change converged in
    time, and at most 15 % more paid than the fixed size."""
    changed = phase_rows[1:]  # the phases after a step change must converge by themselves
    return (run.rc == 0 and drill.every_batch_once(audit) and cost["peak"] <= min(args.max, cost["cap_nodes"])
            and all(p["flaps"] == 0 for p in phase_rows)
            and all(p["converge_s"] is not None and p["converge_s"] <= args.converge_within_s for p in changed)
            and cost["paid"] / cost["fixed_usd"] <= 1.15)


def main(argv: list[str] | None = None) -> int:
    """Run the drill; 0 when it passed (see :func:`passed`)."""
    args = parse_args(argv)
    plan = Plan.parse(args.steps, args.phase_s)
    job = LocalJob.make(args.work, "hetero-autoscale-", TOKEN, plan.total, args.batch_size, args.sample_ms)
    cmd = job_command(args, plan, job)
    print(f"{report.stamp()}: one data node of {1000 / (args.sample_ms * args.batch_size):.0f} batches/s; emulated "
          f"step {' -> '.join(f'{s * 1000:.0f} ms' for s in plan.steps)} at steps {plan.firsts}; {plan.total} "
          f"batches; max {args.max}, cap {args.usd_per_hour} $/h at {PRICE} $/h per node; output {job.work}",
          flush=True)
    run = run_job(job, cmd)
    acts = decisions(job.trainer_log)
    phase_rows = phases(run, plan, job.trainer_log, acts)
    cost = costs(args, plan, run, job.out)
    audit = job.check_audit()
    print_report(args, plan, run, phase_rows, cost, audit)
    summary = {"phases": phase_rows, "peak": cost["peak"], "max": args.max, "cap_nodes": cost["cap_nodes"],
               "paid_usd": cost["paid"], "fixed_nodes": cost["fixed"], "fixed_usd": cost["fixed_usd"],
               "ratio": cost["paid"] / cost["fixed_usd"], "audit": audit, "job_exit": run.rc, "decisions": acts,
               "census": run.census.samples, "command": cmd}
    ok = passed(args, run, phase_rows, cost, audit)
    if run.rc != 0:
        print(run.tail[-3000:])
    return drill.finish(job, summary, ok)


if __name__ == "__main__":
    sys.exit(main())
