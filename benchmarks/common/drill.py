"""The local-job drills (``benchmarks.elastic_drill``, ``benchmarks.autoscale_drill``): a ``hetero
local`` job whose one data node serves ``examples.synthetic`` with ``sleep_ms`` (wall time per
sample without CPU, so every data node adds the same capacity even on a 2-core machine) to an
emulated step; the windows its trainer logs; the audit of every batch it trained; the verdict.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import report

PIPELINE = "examples.synthetic:build_pipeline"
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # the time at the start of each log line
_WINDOW = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*step (\d+): avg step time ([\d.]+) s over the last (\d+)",
                     re.M)


def log_time(text: str) -> float:
    """The wall clock of a log line's time stamp."""
    return datetime.datetime.strptime(text, LOG_TIME).timestamp()


def windows(log: Path) -> list[tuple[float, int, float]]:
    """(wall clock, last step, mean step time) of each logged window of the trainer."""
    if not log.exists():
        return []
    return [(log_time(m.group(1)), int(m.group(2)), float(m.group(3)))
            for m in _WINDOW.finditer(log.read_text(errors="replace"))]


def add_job_options(ap: argparse.ArgumentParser) -> None:
    """The options every drill's job takes: its folder, its data node's speed, its batch."""
    ap.add_argument("--work", type=Path, default=None, help="folder for the job's output (default: a temp dir)")
    ap.add_argument("--sample-ms", type=float, default=5.0, help="wall time per sample on a data node")
    ap.add_argument("--batch-size", type=int, default=8)


@dataclass
class LocalJob:
    """A ``hetero local`` job on one data node: its folder, token and pipeline options."""

    work: Path
    token: str
    options: dict  # the pipeline's, ``sleep_ms`` included

    @classmethod
    def make(cls, work: Path | None, prefix: str, token: str, batches: int, batch_size: int,
             sample_ms: float) -> "LocalJob":
        """A job of ``batches`` batches per epoch in ``work`` (default: a new temp folder named ``prefix``...)."""
        work = work or Path(tempfile.mkdtemp(prefix=prefix))
        work.mkdir(parents=True, exist_ok=True)
        return cls(work, token, {"size": batches * batch_size, "batch_size": batch_size, "sleep_ms": sample_ms})

    @property
    def registry(self) -> Path:
        """The folder registry the data nodes join."""
        return self.work / "registry"

    @property
    def audit(self) -> Path:
        """The audit log: one line per trained batch."""
        return self.work / "audit.jsonl"

    @property
    def out(self) -> Path:
        """The job's output: logs, metrics."""
        return self.work / "out"

    @property
    def trainer_log(self) -> Path:
        """Rank 0's log: its windows, its advice and autoscale lines."""
        return self.out / "logs" / "algo-1.log"

    def hyperparameters(self, step_s: float, advice_every: int, price: float, schedule: str | None = None) -> dict:
        """The job's hyperparameters: the pipeline, one loader worker, the emulated step (and its
        ``schedule`` of later steps), the live advice every ``advice_every`` steps at ``price`` $/h a node."""
        step = {"emulate_step_s": step_s, **({"emulate_step_schedule": schedule} if schedule is not None else {})}
        return {"pipeline": PIPELINE, **{f"pipeline.{k}": v for k, v in self.options.items()}, "data_workers": 1,
                **step, "advice_every": advice_every, "warmup_steps": 10, "log_every": 50, "evaluate": "",
                "advice_prices": json.dumps({"ml.local": price})}

    def command(self, hps: dict, timeout: int, epochs: int | None = None, extra: tuple[str, ...] = ()) -> list[str]:
        """``hetero local`` with one data node, the registry and audit of this job, and ``hps``."""
        cmd = [sys.executable, "-m", "hetero", "local", "--data-nodes", "1", "--registry", str(self.registry),
               "--audit", str(self.audit), "--output", str(self.out),
               *(["--epochs", str(epochs)] if epochs is not None else []), "--quiet", "--timeout", str(timeout),
               *extra]
        for k, v in hps.items():
            cmd += ["--hp", f"{k}={v}"]
        return cmd

    def env(self) -> dict:
        """This process's environment with the job's token."""
        return {**os.environ, "HETERO_JOB_TOKEN": self.token}

    def check_audit(self) -> dict:
        """The audit log accounted against the epoch plan: delivered, lost, duplicated, corrupt."""
        from hetero.testing import check_audit

        # the sleep changes no byte: verify against the same pipeline without it (fast)
        return check_audit(self.audit, {k: v for k, v in self.options.items() if k != "sleep_ms"}, seed=0,
                           pipeline=PIPELINE)


def audit_line(counts: dict, total: int) -> str:
    """The audit's figures against the ``total`` batches the job should have trained."""
    return (f"audit: {counts['delivered']} batches trained of {total}, lost {counts['lost']}, duplicated "
            f"{counts['duplicated']}, corrupt {counts['corrupt']}")


def every_batch_once(counts: dict) -> bool:
    """Nothing lost, duplicated or corrupt."""
    return counts["lost"] == counts["duplicated"] == counts["corrupt"] == 0


def finish(job: LocalJob, summary: dict, ok: bool) -> int:
    """Write ``drill.json``, print the verdict; the exit status."""
    report.write_json(job.work / "drill.json", summary, indent=1, default=str)
    print("drill: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1
