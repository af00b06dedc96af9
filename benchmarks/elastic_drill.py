"""The elastic drill: a starved job is advised +k data nodes, k join mid-epoch, one drains, one dies.

    python -m benchmarks.elastic_drill [--sample-ms 5] [--step-s 0.01] [--epochs 3]

1. ``hetero local`` runs a job with ONE data node and a registry folder. Its pipeline
   (``examples.synthetic`` with ``sleep_ms``: wall time per sample without CPU, so that every data
   node adds the same capacity even on a 2-core machine) starves the emulated step.
2. Rank 0's live advice says "+k data nodes" and the step time that would give.
3. k ``hetero serve --join REGISTRY`` processes start mid-epoch; the trainer's step time over the
   following windows is compared with the advice's prediction (goal: within 20 %).
4. One joined server is drained (``hetero shutdown --drain``) and another killed -9, mid-epoch.
5. When the job ends, its audit log (one line per trained batch) is accounted against the epoch
   plan: every batch of every epoch exactly once, byte-identical to an in-process build.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import cli, drill, report
from benchmarks.common.drill import PIPELINE, LocalJob, windows

TOKEN = "elastic-drill-token"
PRICE = 0.5  # $/h of one emulated data node, for the advice


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    """``predicate()``'s first true value within ``timeout`` seconds; ends the drill if none comes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(poll)
    raise SystemExit(f"elastic drill: timed out after {timeout:.0f} s waiting for {what}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The drill's command line."""
    ap = cli.parser(__doc__)
    drill.add_job_options(ap)
    ap.add_argument("--step-s", type=float, default=0.01, help="emulated accelerator step")
    ap.add_argument("--batches", type=int, default=500, help="batches per epoch")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--advice-every", type=int, default=100)
    ap.add_argument("--max-join", type=int, default=6, help="start at most this many servers")
    return ap.parse_args(argv)


def first_advice(job: LocalJob, max_join: int) -> tuple[int, float]:
    """Wait for rank 0's first advice; the data nodes it adds (at most ``max_join``) and the step it predicts."""
    from hetero.commands.stats import latest_advice

    logs = job.out / "logs"
    advice = wait_for(lambda: logs.is_dir() and latest_advice(logs), 240, "the first advice line")
    k = int(advice["figures"].get("advice:data_node_change", 0))
    predicted = advice["figures"].get("advice:predicted_step_s")
    print(f"advice: {advice['advice'].split('INFO ', 1)[-1]}", flush=True)
    if k <= 0 or predicted is None:
        raise SystemExit(f"elastic drill: the advice is {k:+d} nodes; the pipeline does not starve the step")
    return min(k, max_join), predicted


def join_servers(job: LocalJob, k: int, joined: list) -> float:
    """Start ``k`` ``hetero serve --join`` processes mid-epoch (into ``joined``, so the caller stops
    them whatever happens); the wall clock once all are ready."""
    from hetero.testing import ServerProc

    t_join = time.time()
    for i in range(k):
        s = ServerProc(job.options, token=TOKEN, workers=1, pipeline=PIPELINE, log_path=job.work / f"joined-{i}.log")
        s.cmd += ["--join", str(job.registry), "--advertise-host", "127.0.0.1"]
        joined.append(s.start(wait=False))
    for s in joined:
        s.wait_ready(timeout=120)
    t_ready = time.time()
    print(f"joined {k} servers mid-epoch (ready {t_ready - t_join:.1f} s after the first started)", flush=True)
    return t_ready


def step_times(log: Path, before: list, ready: float) -> tuple[float, float]:
    """The trainer's step time before the join (median of the last 3 windows) and after it (of the
    first 4 windows once every rank has seen the new servers)."""
    settle = ready + 3.0  # every rank polls the registry about once a second
    wait_for(lambda: len([w for w in windows(log) if w[0] > settle]) >= 4, 240, "four windows after the join")
    after = [w for w in windows(log) if w[0] > settle][:4]
    old = statistics.median(w[2] for w in before[-3:]) if before else float("nan")
    return old, statistics.median(w[2] for w in after)


def drain_and_kill(drained, killed) -> None:
    """Drain one joined server (``hetero shutdown --drain``) and kill -9 another, mid-epoch."""
    t0 = time.monotonic()
    rc = subprocess.run([sys.executable, "-m", "hetero", "shutdown", "--drain", "--token", TOKEN, drained.address],
                        capture_output=True, text=True, timeout=120).returncode
    print(f"drained {drained.address} mid-epoch in {time.monotonic() - t0:.1f} s (exit {rc})", flush=True)
    killed.kill()
    print(f"killed -9 {killed.address} mid-epoch", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the drill; 0 when the step after the join is within 20 % of the advice and the audit is clean."""
    args = parse_args(argv)
    job = LocalJob.make(args.work, "hetero-drill-", TOKEN, args.batches, args.batch_size, args.sample_ms)
    job.registry.mkdir(exist_ok=True)
    job.audit.unlink(missing_ok=True)
    cmd = job.command(job.hyperparameters(args.step_s, args.advice_every, PRICE), timeout=900, epochs=args.epochs)
    print(f"{report.stamp()}: one data node, {args.sample_ms} ms per sample x {args.batch_size} = "
          f"{args.sample_ms * args.batch_size:.0f} ms per batch, emulated step {args.step_s * 1000:.0f} ms, "
          f"{args.batches} batches x {args.epochs} epochs; output {job.work}", flush=True)
    proc = subprocess.Popen(cmd, env=job.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    joined: list = []
    try:
        k, predicted = first_advice(job, args.max_join)
        before = windows(job.trainer_log)
        ready = join_servers(job, k, joined)
        old, measured = step_times(job.trainer_log, before, ready)
        ratio = measured / predicted
        print(f"step time: {old * 1000:.1f} ms before the join, {measured * 1000:.1f} ms after (median of 4 windows); "
              f"advice predicted {predicted * 1000:.1f} ms: measured / predicted = {ratio:.2f}", flush=True)
        if len(joined) >= 2:
            drain_and_kill(joined[0], joined[1])
        rc = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        for s in joined:
            s.stop()
    counts = job.check_audit()
    print(f"job exit {rc}; {drill.audit_line(counts, args.batches * args.epochs)}")
    summary = {"advice_nodes": k, "predicted_step_s": predicted, "measured_step_s": measured, "ratio": ratio,
               "before_step_s": old, "audit": counts, "job_exit": rc}
    return drill.finish(job, summary, rc == 0 and drill.every_batch_once(counts) and abs(ratio - 1) <= 0.2)


if __name__ == "__main__":
    sys.exit(main())
