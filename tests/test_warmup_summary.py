"""A run whose every step was warm-up says so in its summaries, instead of "n/a s"."""
import re

from hetero.commands.local import summary_line as local_line
from launcher.metric_lines import METRIC_DEFINITIONS, JobMetrics, summary_line
from launcher.train.step_stats import StepStats, job_metrics


def _metrics(steps: int, warmup: int) -> dict:
    stats = StepStats(warmup=warmup, log_every=100)
    for _ in range(steps):
        stats.record(0.001, 0.01, 8)
    base = {"mode": "heterogeneous", "step_kind": "real", "final_loss": 1.5, "test_accuracy": None,
            "warmup_steps": warmup}
    return job_metrics([dict(stats.summary(), rank=0, host="algo-1")], base)


def test_a_run_of_only_warm_up_steps_says_none_was_measured_and_how_to_get_one():
    m = _metrics(steps=5, warmup=5)
    assert m["avg_step_time_s"] is None
    words = ("avg step time: none measured (all 5 steps were warm-up, warmup_steps=5; run more than 5 steps or "
             "lower warmup_steps)")
    trainer = summary_line(m, "/out")
    assert trainer.startswith(f"done: {words} (real), loss 1.5000") and "n/a s" not in trainer
    local = local_line(JobMetrics.from_json(m))
    assert local == f"heterogeneous: {words} (real step, 5 steps/rank), test accuracy n/a"
    for line in (trainer, local):  # no figure for the step-time, wait or rate metrics
        for d in METRIC_DEFINITIONS:
            if d["Name"].startswith("train:") and d["Name"] != "train:loss":
                assert not re.search(d["Regex"], line), (d["Name"], line)


def test_a_run_past_its_warm_up_prints_its_average():
    m = _metrics(steps=6, warmup=5)
    assert m["avg_step_time_s"] is not None
    assert summary_line(m, "/out").startswith(f"done: avg step time {m['avg_step_time_s']:.4f} s (real), data wait")
    local = local_line(JobMetrics.from_json(m))
    assert "none measured" not in local and "avg step time" in local
