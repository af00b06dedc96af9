"""The resharding drill: an epoch stopped on R ranks goes on, exactly once, on R' ranks.

    python -m benchmarks.reshard_drill [--cases 4:2,2:3,3:1,2:4] [--kill both|no|yes] [--json PATH]

Each case is two real ``torchrun`` runs of ``examples/elastic_resume.py`` (gloo on CPU, the ranks
stepping together through an all-reduce, ``RemoteDataset`` over two ``hetero serve`` data nodes):

1. R ranks train a few steps; every rank's data state is gathered into one checkpoint file;
2. torchrun starts a new world of R' ranks, each loads the list of the old ranks' states and
   trains the rest of the epoch dealt to it; with ``--kill yes`` one data node is killed -9 while
   they do (and brought back for the next case).

The audit logs of both runs (one line per trained batch) are then accounted: every batch of the
epoch trained once (lost 0, duplicated 0; only ``remainder="drop"``'s last few of the rest left
out, fewer than R'), each batch's bytes equal to an in-process build of it.
"""
from __future__ import annotations

import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import cli, report
from hetero.testing import ServerProc
from hetero.testing.audit import Reference, read_audit
from hetero.testing.processes import PIPELINE, TOKEN

OPTIONS = {"size": 240, "batch_size": 4, "shape": [1, 8, 8]}  # 60 batches an epoch
SEED = 7
SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "elastic_resume.py"


def torchrun(nproc: int, servers: list[str], run: str, work: Path, stop_at: int, step_s: float) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "--max-restarts", "0", str(SCRIPT), "--servers", ",".join(servers), "--token", TOKEN,
           "--seed", str(SEED), "--tag", run, "--audit-dir", str(work), "--ckpt", str(work / "ckpt.pt"),
           "--stop-at", str(stop_at), "--step-s", str(step_s)]
    log = open(work / f"{run}.log", "wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=SCRIPT.parent.parent)


def finish(proc: subprocess.Popen, work: Path, run: str, timeout: float) -> None:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        code = None
    if code != 0:
        tail = (work / f"{run}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"torchrun {run} exited {code}:\n{tail}")


def lines(work: Path, run: str) -> int:
    return sum(len(read_audit(p)) for p in work.glob(f"{run}-rank*.jsonl"))


def run_case(old: int, new: int, kill: bool, work: Path, servers: list[ServerProc], stop_at: int = 4,
             step_s: float = 0.03, timeout: float = 240.0) -> dict:
    """One case: ``old`` ranks train ``stop_at`` steps, ``new`` ranks the rest; returns its audit."""
    work.mkdir(parents=True)
    addresses = [s.address for s in servers]
    finish(torchrun(old, addresses, "before", work, stop_at, step_s), work, "before", timeout)
    proc = torchrun(new, addresses, "after", work, 0, step_s)
    killed = False
    if kill:
        deadline = time.monotonic() + timeout
        while lines(work, "after") < 2 * new and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            servers[-1].kill()
            killed = True
    try:
        finish(proc, work, "after", timeout)
    finally:
        if kill:
            servers[-1].start()
    return dict(audit(work, old, new), old=old, new=new, killed=killed)


def audit(work: Path, old: int, new: int) -> dict:
    """Trained, lost, duplicated and corrupt batches of epoch 0 over both runs' audit logs."""
    ref = Reference(PIPELINE, OPTIONS, SEED)
    rows = {run: [r for p in sorted(work.glob(f"{run}-rank*.jsonl")) for r in read_audit(p) if r["epoch"] == 0]
            for run in ("before", "after")}
    every = rows["before"] + rows["after"]
    seen = collections.Counter(r["batch"] for r in every)
    total = len(ref.digests(0))
    left = total - len(rows["before"])
    per_rank = collections.Counter(r["rank"] for r in rows["after"])
    return {"batches": total, "before": len(rows["before"]), "after": len(rows["after"]),
            "per_new_rank": sorted(set(per_rank.values())),
            "left_out": total - len(seen), "allowed_left_out": left % new,
            # the ranks stepped together, so the rest is the epoch's tail and "drop" leaves out its last few
            "lost": sum(1 for b in range(total - left % new) if b not in seen),
            "duplicated": sum(n - 1 for n in seen.values()),
            "corrupt": sum(1 for r in every if r["sha256"] != ref(0, r["batch"]))}


def verdict(rows: list[dict]) -> bool:
    return all(r["lost"] == 0 and r["duplicated"] == 0 and r["corrupt"] == 0 and len(r["per_new_rank"]) == 1
               and r["left_out"] == r["allowed_left_out"] for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__, "python -m benchmarks.reshard_drill")
    ap.add_argument("--cases", default="4:2,2:3,3:1,2:4", help="old:new rank counts, comma-separated")
    ap.add_argument("--kill", choices=("both", "no", "yes"), default="both",
                    help="kill -9 a data node during the resumed part: in a second pass (both), never, always")
    cli.add_json(ap)
    args = ap.parse_args(argv)
    cases = [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",")]
    kills = {"both": (False, True), "no": (False,), "yes": (True,)}[args.kill]
    work = Path(tempfile.mkdtemp(prefix="reshard-drill-"))
    servers = [ServerProc(OPTIONS, pipeline=PIPELINE, workers=1).start() for _ in range(2)]
    rows = []
    try:
        for kill in kills:
            for old, new in cases:
                row = run_case(old, new, kill, work / f"{old}to{new}{'-kill' if kill else ''}", servers)
                rows.append(row)
                print(f"{old} -> {new} ranks{', a data node killed -9' if kill else ''}: {row}", flush=True)
    finally:
        for s in servers:
            s.stop()
    ok = verdict(rows)
    print(f"\n{report.command('python -m benchmarks.reshard_drill', argv)}, {report.stamp()}, "
          f"{OPTIONS['size'] // OPTIONS['batch_size']} batches an epoch\n")
    print(markdown(rows))
    print("\nverdict:", "every batch of the epoch trained once, none twice" if ok else "FAILED")
    report.write_json(args.json, {"cases": rows, "ok": ok})
    return 0 if ok else 1


def markdown(rows: list[dict]) -> str:
    head = ["ranks", "data node killed -9", "trained on R", "trained on R'", "per new rank", "left out (drop)",
            "lost", "duplicated", "corrupt"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['old']} -> {r['new']}", "yes" if r["killed"] else "no", r["before"], r["after"],
                 ",".join(map(str, r["per_new_rank"])), r["left_out"], r["lost"], r["duplicated"], r["corrupt"]]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
