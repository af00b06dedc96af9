"""The launcher resumes a checkpoint written by another number of DNN ranks: the epoch's untrained
batches are dealt to the new ranks, and across both runs every batch trains exactly once."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hetero.local import EXIT_STOPPED, LocalJob, run_local
from launcher.train import checkpoint

from _launcher_helpers import SYNTHETIC_HPS
from test_resume import audit_batches, logs_of

# 400 samples of batch 8: 50 batches an epoch
HPS = {**SYNTHETIC_HPS, "pipeline.size": 400, "emulate_step_s": 0.01, "log_every": 5, "loader_workers": 0,
       "warmup_steps": 2}


def local_job(tmp_path: Path, name: str, ckpt: Path, audit: Path, procs: int, **kw) -> LocalJob:
    return LocalJob(output=tmp_path / name, checkpoint_dir=ckpt, audit=audit,
                    hyperparameters={**HPS, "procs_per_node": procs}, timeout_s=300, echo=False, synth_train=64,
                    synth_test=0, **kw)


def every_batch_once(audit: Path) -> tuple[int, int, int]:
    """(trained, lost, duplicated) of epoch 0 across every run that appended to ``audit``."""
    trained = [b for r in audit_batches(audit).values() for b in r]
    return len(trained), len(set(range(50)) - set(trained)), len(trained) - len(set(trained))


@pytest.mark.slow  # tests/test_resharding.py and tests/test_reshard_torchrun.py cover the deal by default
def test_a_checkpoint_of_2_ranks_resumes_on_1_and_on_3(tmp_path):
    ckpt, audit = tmp_path / "ckpt", tmp_path / "audit.jsonl"
    first = run_local(local_job(tmp_path, "two", ckpt, audit, 2,
                                sigterm_on=r"rank 0 INFO launcher.train.step_stats: step 10:"))
    assert first.stopped, logs_of(first)
    saved = checkpoint.load(str(ckpt))
    assert saved["world_size"] == 2 and len(saved["data"]) == 2
    step = saved["data"][0]["position"]
    assert {s["position"] for s in saved["data"]} == {step} and 10 <= step < 25, saved["data"]

    for procs in (1, 3):
        ckpt_n, audit_n = tmp_path / f"ckpt{procs}", tmp_path / f"audit{procs}.jsonl"
        shutil.copytree(ckpt, ckpt_n)
        shutil.copy(audit, audit_n)
        run = run_local(local_job(tmp_path, f"on{procs}", ckpt_n, audit_n, procs))
        assert run.ok, logs_of(run)
        left = 50 - 2 * step
        per_rank = left // procs
        assert run.metrics["world_size"] == procs and run.metrics["resumed_from_steps"] == step
        assert run.metrics["steps"] == per_rank, run.metrics
        trained, lost, duplicated = every_batch_once(audit_n)
        assert duplicated == 0 and trained == 2 * step + per_rank * procs
        assert lost == left % procs  # equal counts per rank: only the last few of the rest are left out
        log = (run.output / "logs" / "algo-1.log").read_text()
        assert (f"the checkpoint was written by 2 rank(s), this job has {procs}: epoch 0 goes on with the {left} "
                f"of its 50 batches no rank trained, {per_rank} to each rank") in log, log[-3000:]
        done = checkpoint.load(str(ckpt_n))
        assert done["world_size"] == procs and all(s["epoch"] == 1 for s in done["data"])
    assert first.exit_codes["algo-1"] == EXIT_STOPPED
