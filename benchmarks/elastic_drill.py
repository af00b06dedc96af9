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
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOKEN = "elastic-drill-token"
PIPELINE = "examples.synthetic:build_pipeline"
_WINDOW = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*step (\d+): avg step time ([\d.]+) s over the last (\d+)",
                     re.M)


def windows(log: Path) -> list[tuple[float, int, float]]:
    """(wall clock, last step, mean step time) of each logged window of the trainer."""
    import datetime

    if not log.exists():
        return []
    return [(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), int(m.group(2)),
             float(m.group(3))) for m in _WINDOW.finditer(log.read_text(errors="replace"))]


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(poll)
    raise SystemExit(f"elastic drill: timed out after {timeout:.0f} s waiting for {what}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None, help="folder for the job's output (default: a temp dir)")
    ap.add_argument("--sample-ms", type=float, default=5.0, help="wall time per sample on a data node")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--step-s", type=float, default=0.01, help="emulated accelerator step")
    ap.add_argument("--batches", type=int, default=500, help="batches per epoch")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--advice-every", type=int, default=100)
    ap.add_argument("--max-join", type=int, default=6, help="start at most this many servers")
    args = ap.parse_args(argv)
    from hetero.commands.stats import latest_advice
    from hetero.testing import ServerProc, check_audit

    work = args.work or Path(tempfile.mkdtemp(prefix="hetero-drill-"))
    work.mkdir(parents=True, exist_ok=True)
    registry, audit, out = work / "registry", work / "audit.jsonl", work / "out"
    registry.mkdir(exist_ok=True)
    if audit.exists():
        audit.unlink()
    options = {"size": args.batches * args.batch_size, "batch_size": args.batch_size, "sleep_ms": args.sample_ms}
    hps = {"pipeline": PIPELINE, **{f"pipeline.{k}": v for k, v in options.items()}, "data_workers": 1,
           "emulate_step_s": args.step_s, "advice_every": args.advice_every, "warmup_steps": 10, "log_every": 50,
           "evaluate": "", "advice_prices": json.dumps({"ml.local": 0.5})}
    cmd = [sys.executable, "-m", "hetero", "local", "--data-nodes", "1", "--registry", str(registry), "--audit",
           str(audit), "--output", str(out), "--epochs", str(args.epochs), "--quiet", "--timeout", "900"]
    for k, v in hps.items():
        cmd += ["--hp", f"{k}={v}"]
    env = {**os.environ, "HETERO_JOB_TOKEN": TOKEN}
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: one data node, {args.sample_ms} ms per sample "
          f"x {args.batch_size} = {args.sample_ms * args.batch_size:.0f} ms per batch, emulated step "
          f"{args.step_s * 1000:.0f} ms, {args.batches} batches x {args.epochs} epochs; output {work}", flush=True)
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    joined: list = []
    try:
        logs = out / "logs"
        advice = wait_for(lambda: logs.is_dir() and latest_advice(logs), 240, "the first advice line")
        k = int(advice["figures"].get("advice:data_node_change", 0))
        predicted = advice["figures"].get("advice:predicted_step_s")
        print(f"advice: {advice['advice'].split('INFO ', 1)[-1]}", flush=True)
        if k <= 0 or predicted is None:
            raise SystemExit(f"elastic drill: the advice is {k:+d} nodes; the pipeline does not starve the step")
        k = min(k, args.max_join)
        trainer_log = logs / "algo-1.log"
        before = windows(trainer_log)
        t_join = time.time()
        for i in range(k):
            s = ServerProc(options, token=TOKEN, workers=1, pipeline=PIPELINE, log_path=work / f"joined-{i}.log")
            s.cmd += ["--join", str(registry), "--advertise-host", "127.0.0.1"]
            joined.append(s.start(wait=False))
        for s in joined:
            s.wait_ready(timeout=120)
        t_ready = time.time()
        print(f"joined {k} servers mid-epoch (ready {t_ready - t_join:.1f} s after the first started)", flush=True)
        settle = t_ready + 3.0  # every rank polls the registry about once a second
        wait_for(lambda: len([w for w in windows(trainer_log) if w[0] > settle]) >= 4, 240, "four windows after the join")
        after = [w for w in windows(trainer_log) if w[0] > settle][:4]
        measured = statistics.median(w[2] for w in after)
        old = statistics.median(w[2] for w in before[-3:]) if before else float("nan")
        ratio = measured / predicted
        print(f"step time: {old * 1000:.1f} ms before the join, {measured * 1000:.1f} ms after (median of 4 windows); "
              f"advice predicted {predicted * 1000:.1f} ms: measured / predicted = {ratio:.2f}", flush=True)
        if len(joined) >= 2:
            drained, killed = joined[0], joined[1]
            t0 = time.monotonic()
            rc = subprocess.run([sys.executable, "-m", "hetero", "shutdown", "--drain", "--token", TOKEN,
                                 drained.address], capture_output=True, text=True, timeout=120).returncode
            print(f"drained {drained.address} mid-epoch in {time.monotonic() - t0:.1f} s (exit {rc})", flush=True)
            killed.kill()
            print(f"killed -9 {killed.address} mid-epoch", flush=True)
        rc = job.wait(timeout=900)
    finally:
        if job.poll() is None:
            job.kill()
        for s in joined:
            s.stop()
    # the sleep changes no byte: verify against the same pipeline without it (fast)
    counts = check_audit(audit, {k: v for k, v in options.items() if k != "sleep_ms"}, seed=0, pipeline=PIPELINE)
    print(f"job exit {rc}; audit: {counts['delivered']} batches trained of {args.batches * args.epochs}, "
          f"lost {counts['lost']}, duplicated {counts['duplicated']}, corrupt {counts['corrupt']}")
    summary = {"advice_nodes": k, "predicted_step_s": predicted, "measured_step_s": measured, "ratio": ratio,
               "before_step_s": old, "audit": counts, "job_exit": rc}
    (work / "drill.json").write_text(json.dumps(summary, indent=1, default=str))
    ok = rc == 0 and counts["lost"] == counts["duplicated"] == counts["corrupt"] == 0 and abs(ratio - 1) <= 0.2
    print("drill: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
