"""Soak: many epochs through 2-3 data servers and 2 consumers while faults are injected at random.

    python -m benchmarks.soak --batches 100000 --max-seconds 600 [--servers 3] [--json soak.json]

Runs each data server as its own process (``hetero serve`` through ``hetero.testing.ServerProc``:
fixed gRPC and data-plane ports, the data plane behind a loopback proxy so connections can be cut)
and two consumers (``hetero.testing.ConsumerProc``: ranks 0/1 of world 2, each writing the audit
log of ``RemoteDataset``). At random intervals it injects one of:

* ``server_kill``: kill -9 a data server (process group: server and its workers) mid-epoch, then
  restart it on the same ports after a pause (it must rejoin);
* ``worker_kill``: kill -9 one worker process of a data server;
* ``proxy_cut``: sever every data-plane connection through one server's proxy;
* ``consumer_restart``: kill -9 a consumer and start it again; it resumes from its audit log
  (the audit line is written when the batch is handed to the loop, so the log is the checkpoint).

At the end (``--batches`` delivered or ``--max-seconds`` passed) it stops the consumers and
checks every audit line against the epoch plan and the in-process reference bytes, then prints:
batches delivered, lost, duplicated, corrupt, faults injected by kind, max RSS per process at the
start and at the end of the run. Exit status 0 when nothing was lost, duplicated or corrupt.

The building blocks (``ServerProc``, ``ConsumerProc``, ``FaultProxy``, ``check_audit``) live in
``hetero.testing``, shared with the fault tests.
"""
from __future__ import annotations

import collections
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetero.testing import PIPELINE, ConsumerProc, FaultProxy, ServerProc, check_audit, free_port, read_audit

from .common import cli, report

FAULT_KINDS = ("server_kill", "worker_kill", "proxy_cut", "consumer_restart")
WORKERS = 1           # data workers per server
SLOTS_PER_WORKER = 2  # built batches each worker may hold (hetero serve --slots-per-worker)


class RssTrack:
    """Max RSS per label in the first and the last ``window_s`` of the run."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, str, int]] = []

    def add(self, t: float, label: str, rss: int) -> None:
        if rss:
            self.samples.append((t, label, rss))

    def summary(self, start: float, end: float) -> dict[str, dict[str, float]]:
        window = max(10.0, 0.2 * (end - start))
        out: dict[str, dict[str, float]] = {}
        for t, label, rss in self.samples:
            e = out.setdefault(label, {"start_max_mib": 0.0, "end_max_mib": 0.0})
            if t - start <= window:
                e["start_max_mib"] = max(e["start_max_mib"], rss / 2**20)
            if end - t <= window:
                e["end_max_mib"] = max(e["end_max_mib"], rss / 2**20)
        return out

    def timeline(self, start: float, bucket_s: float = 60.0) -> dict[str, list[list[float]]]:
        """Max RSS (MiB) per label in each ``bucket_s`` of the run: shows growth that the
        first/last comparison cannot tell from a warm-up."""
        out: dict[str, dict[int, float]] = {}
        for t, label, rss in self.samples:
            b = int((t - start) // bucket_s)
            per = out.setdefault(label, {})
            per[b] = max(per.get(b, 0.0), rss / 2**20)
        return {label: [[b * bucket_s, round(v, 1)] for b, v in sorted(per.items())] for label, per in out.items()}


class Soak:
    """The run's processes (data servers behind fault proxies, consumer ranks), the faults injected
    into them, and what was seen of them: unplanned exits, RSS, the most slots in use."""

    def __init__(self, options: dict, nservers: int, world: int, epochs: int, seed: int, work: Path,
                 rnd: random.Random, fault_gap: tuple[float, float], kinds: tuple[str, ...], log) -> None:
        self.rnd, self.fault_gap, self.kinds, self.log = rnd, fault_gap, kinds, log
        self.proxies, self.servers = [], []
        for i in range(nservers):
            bulk = free_port()
            proxy = FaultProxy(("127.0.0.1", bulk))
            self.proxies.append(proxy)
            self.servers.append(ServerProc(options, bulk_port=bulk, advertise_bulk_port=proxy.port, workers=WORKERS,
                                           slots=SLOTS_PER_WORKER, log_path=work / f"server{i}.log"))
        self.audits = [work / f"audit-rank{r}.jsonl" for r in range(world)]
        for a in self.audits:
            a.unlink(missing_ok=True)
        self.consumers = [ConsumerProc([s.address for s in self.servers], r, world, self.audits[r], seed=seed,
                                       epochs=epochs, log_path=work / f"consumer{r}.log") for r in range(world)]
        self.faults: collections.Counter = collections.Counter()
        self.consumer_failures = self.server_failures = 0
        self.restarts: list[tuple[float, ServerProc]] = []
        self.rss = RssTrack()
        self.max_slots = 0

    def start(self) -> float:
        """Start the servers, then (once all serve) the consumers; the time the consumers started."""
        for s in self.servers:
            s.start(wait=False)
        for s in self.servers:
            s.wait_ready()
        t0 = time.monotonic()
        for c in self.consumers:
            c.start()
        return t0

    def delivered(self) -> int:
        """Batches the consumers have audited so far."""
        return sum(len(read_audit(a)) for a in self.audits)

    def run(self, t0: float, batches: int, max_seconds: float) -> float:
        """Inject faults until ``batches`` are delivered or ``max_seconds`` have passed; the time it stopped."""
        next_fault = t0 + self.rnd.uniform(*self.fault_gap) + 2.0
        next_sample = t0
        delivered = 0
        while True:
            now = time.monotonic()
            delivered = self.delivered() if now >= next_sample else delivered
            if delivered >= batches or now - t0 >= max_seconds:
                return time.monotonic()
            self.restart_due(now)
            self.revive(now)
            if now >= next_sample:
                next_sample = now + 1.0
                self.sample(now)
            if now >= next_fault:
                next_fault = now + self.rnd.uniform(*self.fault_gap)
                self.inject(now)
            time.sleep(0.1)

    def restart_due(self, now: float) -> None:
        """Start again the killed servers whose pause is over."""
        for when, s in list(self.restarts):
            if now >= when:
                self.restarts.remove((when, s))
                s.start(wait=False)
                s.started_at = now

    def revive(self, now: float) -> None:
        """Count and restart the servers and consumers that exited unplanned."""
        for s in self.servers:  # a server that died unplanned (or failed to start): count it, bring it back
            if not s.alive and not any(s is r for _, r in self.restarts):
                self.server_failures += 1
                self.log(f"[soak] data server {s.address} exited with {s.proc.returncode} unplanned; restarting "
                         f"(see {s.log_path})")
                s.start(wait=False)
                s.started_at = now
        for c in self.consumers:
            if not c.alive and c.proc.returncode != 0:  # 0: it read every epoch asked of it
                self.consumer_failures += 1
                self.log(f"[soak] consumer rank {c.rank} exited with {c.proc.returncode}; restarting "
                         f"(see {c.log_path})")
                c.start()

    def sample(self, now: float) -> None:
        """Record every process's RSS and the most slots in use on any live server."""
        from dnn_worker.transport.control import ControlClient

        for i, s in enumerate(self.servers):
            main, workers = s.rss()
            self.rss.add(now, f"server{i}", main)
            self.rss.add(now, f"server{i}-worker", workers)  # its largest worker
        for c in self.consumers:
            self.rss.add(now, f"consumer{c.rank}", c.rss())
        for s in self.servers:
            if s.alive:
                try:
                    with ControlClient(s.address, s.token) as ctl:
                        self.max_slots = max(self.max_slots, ctl.stats(timeout=2.0).slots_in_use)
                except Exception:
                    pass  # a server going down between the check and the call

    def inject(self, now: float) -> None:
        """One fault of a kind that can land now, drawn at random; counted when it landed."""
        rnd = self.rnd
        # Only faults that can land now: a serving server (never one still loading), a
        # proxy with live connections, a consumer that had time to start.
        ready = [s for s in self.servers if s.alive and now - s.started_at > 3.0 and s.healthy()]
        applicable = {
            "server_kill": len(ready) >= 2 and not self.restarts and len(ready) == len(self.servers),
            "worker_kill": bool(ready),
            "proxy_cut": any(p.live for p in self.proxies),
            "consumer_restart": any(c.alive and now - c.started_at > 8.0 for c in self.consumers),
        }
        choices = [k for k in self.kinds if applicable[k]]
        if not choices:
            return
        kind = rnd.choice(choices)
        done = True
        if kind == "server_kill":
            victim = rnd.choice(ready)
            victim.kill()
            self.restarts.append((now + rnd.uniform(0.5, 3.0), victim))
        elif kind == "worker_kill":
            pids = rnd.choice(ready).worker_pids()
            try:
                os.kill(rnd.choice(pids), signal.SIGKILL)
            except (ProcessLookupError, IndexError):
                done = False
        elif kind == "proxy_cut":
            done = rnd.choice([p for p in self.proxies if p.live]).cut() > 0
        else:
            c = rnd.choice([c for c in self.consumers if c.alive and now - c.started_at > 8.0])
            c.kill()
            c.start()
        self.faults[kind] += done

    def stop_consumers(self) -> None:
        """Stop the consumers, so their audit logs are complete."""
        for c in self.consumers:
            c.stop()

    def close(self) -> None:
        """Kill the consumers, stop the servers, close the proxies."""
        for c in self.consumers:
            c.kill()
        for s in self.servers:
            s.stop(timeout=10)
        for p in self.proxies:
            p.close()


def run_soak(batches: int, max_seconds: float, nservers: int = 3, seed: int = 0, fault_gap: tuple[float, float] = (2.0, 5.0),
             kinds: tuple[str, ...] = FAULT_KINDS, workdir: Path | None = None, options: dict | None = None,
             verify: bool = True, log=print) -> dict[str, Any]:
    """Soak ``nservers`` servers and 2 consumers with faults; the figures :func:`print_report` prints."""
    from data_service.contract.pipeline import PipelineSpec

    rnd = random.Random(seed)
    work = Path(workdir or tempfile.mkdtemp(prefix="hetero-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    options = options or {"size": 512, "batch_size": 4, "shape": [3, 16, 16]}
    per_epoch = PipelineSpec(PIPELINE, options).load().epoch_shape().num_batches
    world = 2
    epochs = max(1, -(-batches // (per_epoch // world * world))) + 1
    soak = Soak(options, nservers, world, epochs, seed, work, rnd, fault_gap, kinds, log)
    t0 = time.monotonic()
    try:
        t0 = soak.start()
        end = soak.run(t0, batches, max_seconds)
        soak.stop_consumers()
    finally:
        soak.close()
    rows = [r for a in soak.audits for r in read_audit(a)]
    acc = check_audit(soak.audits, options, seed, world, complete=False, verify=verify)
    elapsed = end - t0
    return {"batches_target": batches, "max_seconds": max_seconds, "seconds": round(elapsed, 1),
            "servers": nservers, "consumers": world, "workers_per_server": WORKERS,
            "slots_per_worker": SLOTS_PER_WORKER, "batches_per_epoch": per_epoch,
            "epochs_reached": max((r["epoch"] for r in rows), default=-1) + 1,
            **{k: acc[k] for k in ("delivered", "lost", "duplicated", "corrupt", "foreign")},
            "batches_per_s": round(acc["delivered"] / max(elapsed, 1e-9), 1),
            "faults": dict(soak.faults), "faults_total": sum(soak.faults.values()),
            "consumer_failures": soak.consumer_failures, "server_failures": soak.server_failures,
            "server_starts": [s.starts for s in soak.servers], "max_slots_in_use": soak.max_slots,
            "rss_mib": soak.rss.summary(t0, end), "rss_timeline_mib": soak.rss.timeline(t0),
            "lost_examples": acc["lost_examples"],
            "duplicated_examples": acc["duplicated_examples"], "workdir": str(work)}


def print_report(r: dict[str, Any]) -> None:
    """The soak's figures as the run prints them."""
    print(f"soak: {r['seconds']}s, {r['servers']} servers, {r['consumers']} consumers, "
          f"{r['batches_per_epoch']} batches/epoch, {r['epochs_reached']} epochs reached")
    print(f"batches delivered {r['delivered']} ({r['batches_per_s']}/s), lost {r['lost']}, "
          f"duplicated {r['duplicated']}, corrupt {r['corrupt']}, foreign {r['foreign']}")
    print(f"faults injected: {r['faults_total']} " + ", ".join(f"{k}={v}" for k, v in sorted(r['faults'].items())))
    print(f"consumer failures: {r['consumer_failures']}; unplanned server exits {r['server_failures']}; server starts {r['server_starts']}; "
          f"max slots in use {r['max_slots_in_use']}")
    print("max RSS (MiB)        start      end")
    for label, e in sorted(r["rss_mib"].items()):
        print(f"  {label:<18} {e['start_max_mib']:7.1f}  {e['end_max_mib']:7.1f}")
    if r["lost_examples"] or r["duplicated_examples"]:
        print(f"lost (rank, epoch, batch): {r['lost_examples']}; duplicated: {r['duplicated_examples']}")
    print(f"logs and audit files: {r['workdir']}")


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__, prog="python -m benchmarks.soak")
    p.add_argument("--batches", type=int, default=100000, help="stop after this many batches delivered")
    p.add_argument("--max-seconds", type=float, default=600.0, help="stop after this long, whatever was delivered")
    p.add_argument("--servers", type=int, default=3, choices=(2, 3))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault-gap", type=float, nargs=2, default=(2.0, 5.0), metavar=("MIN_S", "MAX_S"),
                   help="seconds between faults, drawn uniformly")
    p.add_argument("--faults", default=",".join(FAULT_KINDS), help=f"kinds to inject (of {','.join(FAULT_KINDS)})")
    p.add_argument("--no-verify", action="store_true", help="skip the byte check against the in-process reference")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.faults.split(",") if k)
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad:
        p.error(f"unknown fault kinds {bad}; choose from {FAULT_KINDS}")
    figures = run_soak(args.batches, args.max_seconds, args.servers, args.seed, tuple(args.fault_gap), kinds,
                       Path(args.workdir) if args.workdir else None, verify=not args.no_verify)
    print_report(figures)
    report.write_json(args.json, figures)
    ok = not any(figures[k] for k in ("lost", "duplicated", "corrupt", "foreign", "consumer_failures",
                                      "server_failures"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
