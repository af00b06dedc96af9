"""The MetricDefinitions every job carries read the launcher's actual log lines.

A real local job (one data node, one DNN node, the MNIST CNN) runs; every regex is applied to
its node logs line by line as SageMaker does, and the last point of each metric must equal the
job's own summary (``metrics.json``, the data node's ``data_node.json``).
"""
import re

import pytest

from hetero.local import LocalJob, run_local
from launcher.serve.data_node import RateMeter
from launcher.metric_lines import METRIC_DEFINITIONS, summary_line, window_line

from _launcher_helpers import FAST_HPS, read_json, synth_data


def points(text: str) -> dict[str, list[float]]:
    """Every metric's data points in ``text``, the way SageMaker reads a log: per line, group 1."""
    found: dict[str, list[float]] = {d["Name"]: [] for d in METRIC_DEFINITIONS}
    for line in text.splitlines():
        for d in METRIC_DEFINITIONS:
            match = re.search(d["Regex"], line)
            if match:
                found[d["Name"]].append(float(match.group(1)))
    return found


@pytest.mark.slow
def test_every_metric_is_found_in_a_real_jobs_logs_with_its_summary_value(tmp_path):
    data = synth_data(tmp_path / "data", train=480, test=80)  # 60 steps of 8 images
    hps = {**FAST_HPS, "log_every": 20, "advice_prices": {"ml.local": 0.5}}
    result = run_local(LocalJob(data=data, output=tmp_path / "out", hyperparameters=hps, timeout_s=240,
                                echo=False, data_nodes=1, dnn_nodes=1))
    logs = {p.stem: p.read_text() for p in (result.output / "logs").glob("*.log")}
    assert result.ok, "\n".join(t[-3000:] for t in logs.values())
    m = result.metrics
    trainer_host = m["dnn_hosts"][0]
    data_host = next(n["host"] for n in m["nodes"] if n["role"] == "data")
    trainer, data_node = points(logs[trainer_host]), points(logs[data_host])

    expected = {"train:step_time_s": m["avg_step_time_s"], "train:data_wait_percent": 100 * m["data_wait_fraction"],
                "train:samples_per_s": m["samples_per_s"], "train:loss": m["final_loss"],
                "test:accuracy": m["test_accuracy"]}
    for name, value in expected.items():
        assert trainer[name], f"{name}: no line of the trainer's log matches {METRIC_DEFINITIONS}"
        assert trainer[name][-1] == pytest.approx(value, abs=0.006), (name, trainer[name])
    advice = m["advice"]  # 60 steps, advice every 200: only the end-of-training advice
    expected_advice = {"advice:data_node_change": advice["change"], "advice:predicted_step_s": advice["predicted_step_s"],
                       "advice:change_usd_per_hour": advice["change_usd_per_hour"],
                       "advice:change_usd_per_epoch": advice["change_usd_per_epoch"]}
    for name, value in expected_advice.items():
        assert len(trainer[name]) == 1, (name, trainer[name])
        assert trainer[name][-1] == pytest.approx(value, abs=6e-5), (name, trainer[name])
    # the periodic lines make a time series: 60 steps, a line every 20, plus the summary
    assert len(trainer["train:step_time_s"]) == 4 and len(trainer["train:samples_per_s"]) == 4
    assert trainer["data:batches_per_s"] == []

    node = read_json(result.output / data_host / "output" / "data_node.json")
    assert node["batches_sent"] == 60 and node["batches_per_s"] > 0
    assert data_node["data:batches_per_s"][-1] == pytest.approx(node["batches_per_s"], abs=1e-4)
    assert all(not data_node[name] for name in {**expected, **expected_advice}), data_node  # none on a data node


def test_the_lines_without_a_value_publish_nothing():
    empty = {"avg_step_time_s": None, "data_wait_fraction": None, "samples_per_s": None, "final_loss": None,
             "test_accuracy": None, "step_kind": "emulated"}
    found = points(summary_line(empty, "/out"))
    assert all(values == [] for values in found.values()), found


def test_window_and_summary_lines_read_back_exactly():
    found = points(window_line("", 50, 0.01234, 50, 0.25, 812.34) + "\n"
                   + summary_line({"avg_step_time_s": 0.5, "data_wait_fraction": 0.125, "samples_per_s": 16.0,
                                   "final_loss": 2.5e-05, "test_accuracy": 0.9, "step_kind": "real"}, "/o"))
    assert found["train:step_time_s"] == [0.0123, 0.5]
    assert found["train:data_wait_percent"] == [25.0, 12.5]
    assert found["train:samples_per_s"] == [812.3, 16.0]
    assert found["train:loss"] == [0.0]  # 4 decimals: a tiny loss reads 0.0000, not a bogus value
    assert found["test:accuracy"] == [0.9]


def test_rate_meter_windows_start_at_the_first_consumer():
    now = [0.0]
    meter = RateMeter(every_s=10.0, clock=lambda: now[0])
    assert meter.poll(False, 0) is None and meter.final(0) == (None, 0.0)
    now[0] = 100.0                     # 100 s waiting for the DNN nodes: not serving time
    assert meter.poll(True, 0) is None
    now[0] = 105.0
    assert meter.poll(True, 50) is None
    now[0] = 110.0
    line = meter.poll(True, 200)
    assert points(line)["data:batches_per_s"] == [20.0] and "over the last 10 s" in line
    now[0] = 120.0
    assert meter.final(400) == (20.0, 20.0)  # 400 batches over the 20 s since the first consumer
