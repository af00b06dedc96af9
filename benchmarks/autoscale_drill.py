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
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.elastic_drill import PIPELINE, wait_for, windows

TOKEN = "autoscale-drill-token"
PRICE = 0.5  # $/h of one emulated data node
_LINE_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
_AUTOSCALE = re.compile(r"autoscale at step (\d+) .*?node change ([+-]?\d+) \((\w+); data nodes (\d+) -> (\d+), "
                        r"advised (\S+),")


def _stamp(line: str) -> float | None:
    import datetime

    m = _LINE_TIME.match(line)
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None, help="folder for the job's output (default: a temp dir)")
    ap.add_argument("--sample-ms", type=float, default=5.0, help="wall time per sample on a data node")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", default="0.06,0.02,0.04", help="the emulated step of each phase, seconds")
    ap.add_argument("--phase-s", default="60,90,90", help="each phase's ideal length, seconds")
    ap.add_argument("--max", type=int, default=6)
    ap.add_argument("--usd-per-hour", type=float, default=3.0, help="the $/h cap on the data group")
    ap.add_argument("--cooldown-s", type=float, default=20.0)
    ap.add_argument("--in-after", type=int, default=3, help="advice windows in a row that say fewer before a drain")
    ap.add_argument("--advice-every", type=int, default=100)
    ap.add_argument("--converge-within-s", type=float, default=60.0, help="the stated time to converge")
    args = ap.parse_args(argv)
    from hetero.testing import check_audit

    steps = [float(s) for s in args.steps.split(",")]
    lengths = [float(s) for s in args.phase_s.split(",")]
    counts = [int(round(length / step)) for step, length in zip(steps, lengths)]
    firsts = [sum(counts[:i]) for i in range(len(counts))]
    total = sum(counts)
    work = args.work or Path(tempfile.mkdtemp(prefix="hetero-autoscale-"))
    work.mkdir(parents=True, exist_ok=True)
    registry, audit, out = work / "registry", work / "audit.jsonl", work / "out"
    options = {"size": total * args.batch_size, "batch_size": args.batch_size, "sleep_ms": args.sample_ms}
    schedule = ",".join(f"{first}:{step}" for first, step in zip(firsts[1:], steps[1:]))
    hps = {"pipeline": PIPELINE, **{f"pipeline.{k}": v for k, v in options.items()}, "data_workers": 1,
           "emulate_step_s": steps[0], "emulate_step_schedule": schedule, "advice_every": args.advice_every,
           "warmup_steps": 10, "log_every": 50, "evaluate": "", "advice_prices": json.dumps({"ml.local": PRICE})}
    scale = {"min": 1, "max": args.max, "usd_per_hour": args.usd_per_hour, "cooldown_s": args.cooldown_s,
             "in_after": args.in_after, "workers": 1, "ttl_s": 5}
    cmd = [sys.executable, "-m", "hetero", "local", "--data-nodes", "1", "--registry", str(registry), "--audit",
           str(audit), "--output", str(out), "--quiet", "--timeout", "1200", "--autoscale",
           *[f"{k}={v}" for k, v in scale.items()]]
    for k, v in hps.items():
        cmd += ["--hp", f"{k}={v}"]
    env = {**os.environ, "HETERO_JOB_TOKEN": TOKEN}
    per_node = 1000 / (args.sample_ms * args.batch_size)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: one data node of {per_node:.0f} "
          f"batches/s; emulated step {' -> '.join(f'{s * 1000:.0f} ms' for s in steps)} at steps {firsts}; "
          f"{total} batches; max {args.max}, cap {args.usd_per_hour} $/h at {PRICE} $/h per node; output {work}",
          flush=True)
    census = Census(registry, own=0).start()  # the job's own data node registers too
    started = time.time()
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        tail = job.communicate(timeout=1500)[0]
    finally:
        if job.poll() is None:
            job.kill()
        census.stop()
    ended = time.time()
    rc = job.returncode
    log = out / "logs" / "algo-1.log"
    acts = decisions(log)
    wins = windows(log)  # (wall clock, last step, mean step) of each window line

    def step_time(step: int) -> float:  # wall clock when the trainer passed ``step``
        return next((t for t, s, _ in wins if s >= step), ended)

    trained = wins[-1][0] if wins else ended  # the last step: after it the job's end stops every server
    bounds = [step_time(f) if f else started for f in firsts] + [trained]
    phases = []
    for i, step in enumerate(steps):
        start, end = bounds[i], bounds[i + 1]
        advised = [a["advised"] for a in acts if start <= a["t"] < end and a["advised"] is not None]
        phases.append({"step_s": step, "start": round(start - started, 1), "length_s": round(end - start, 1),
                       **phase_report(census, acts, start, end, advised[-1] if advised else 1)})
    metrics = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").exists() else {}
    node_cap = (metrics.get("advice") or {}).get("node_capacity_per_s") or 1000 / (args.sample_ms * args.batch_size)
    fixed = max(1, math.ceil(max(1 / s for s in steps) / node_cap - 1e-9))  # meets the shortest step
    ideal_s = sum(c * s for c, s in zip(counts, steps))
    paid = census.node_seconds(started, ended) * PRICE / 3600
    fixed_usd = fixed * ideal_s * PRICE / 3600
    cap_nodes = int(args.usd_per_hour / PRICE + 1e-9)
    peak = max((n for _, n in census.samples), default=0)
    counts_audit = check_audit(audit, {k: v for k, v in options.items() if k != "sleep_ms"}, seed=0,
                               pipeline=PIPELINE)
    for i, p in enumerate(phases):
        print(f"phase {i + 1}: step {p['step_s'] * 1000:.0f} ms from {p['start']} s for {p['length_s']} s: advised "
              f"{p['advised']} nodes; within one node of it after {p['converge_s']} s, at it after {p['reach_s']} s; "
              f"peak {p['peak']}, "
              f"overshoot {p['overshoot']}, final {p['final']}; actions {p['actions']}, flaps {p['flaps']}")
    print(f"never above max {args.max} / cap {cap_nodes} nodes: peak {peak}")
    print(f"$ paid {paid:.5f} (node-seconds at {PRICE} $/h) vs {fixed_usd:.5f} for {fixed} fixed node(s) over the "
          f"ideal {ideal_s:.0f} s: ratio {paid / fixed_usd:.2f} (node capacity {node_cap:.1f} batches/s)")
    print(f"job exit {rc} after {ended - started:.0f} s; audit: {counts_audit['delivered']} batches trained of "
          f"{total}, "
          f"lost {counts_audit['lost']}, duplicated {counts_audit['duplicated']}, corrupt {counts_audit['corrupt']}")
    summary = {"phases": phases, "peak": peak, "max": args.max, "cap_nodes": cap_nodes, "paid_usd": paid,
               "fixed_nodes": fixed, "fixed_usd": fixed_usd, "ratio": paid / fixed_usd, "audit": counts_audit,
               "job_exit": rc, "decisions": acts, "census": census.samples, "command": cmd}
    (work / "drill.json").write_text(json.dumps(summary, indent=1, default=str))
    changed = phases[1:]  # the phases after a step change must converge by themselves
    ok = (rc == 0 and counts_audit["lost"] == counts_audit["duplicated"] == counts_audit["corrupt"] == 0
          and peak <= min(args.max, cap_nodes) and all(p["flaps"] == 0 for p in phases)
          and all(p["converge_s"] is not None and p["converge_s"] <= args.converge_within_s for p in changed)
          and paid / fixed_usd <= 1.15)
    if rc != 0:
        print(tail[-3000:])
    print("drill: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
