"""The planner's arithmetic (hetero/planning/planner.py), the one-core profile and ``hetero plan``."""
from __future__ import annotations

import json
import os

import pytest

from hetero.planning.cost import InstancePrice, PriceTable, load_prices
from hetero.planning.plan_text import format_plan
from hetero.planning.planner import PlanError, Workload, plan, predict_step
from launcher.capacity import Binding
from hetero.planning.profile import profile_pipeline
from hetero.cli import main as hetero_main


def _row(name: str, usd: float, vcpus: int, gpus: int = 0) -> InstancePrice:
    return InstancePrice(name, usd, vcpus, gpus, "test", "2026-01")


@pytest.fixture
def table() -> PriceTable:
    """Round prices so every figure below can be worked out by hand."""
    rows = [_row("gpu", 4.0, 8, 1), _row("gpu4", 16.0, 32, 4), _row("small", 1.0, 4), _row("big", 2.5, 16)]
    return PriceTable({r.instance_type: r for r in rows}, region="test", as_of="2026-01")


def test_predict_step_data_bound_and_gpu_bound():
    p = predict_step(0.16, 0.05, cores=1)
    assert p.binding is Binding.CORES and p.step_s == pytest.approx(0.16) and p.data_s == pytest.approx(0.16)
    assert p.data_wait_fraction == pytest.approx((0.16 - 0.05) / 0.16)
    p = predict_step(0.16, 0.05, cores=2)
    assert p.step_s == pytest.approx(0.08) and p.data_wait_fraction == pytest.approx(0.03 / 0.08)
    p = predict_step(0.16, 0.05, cores=4)
    assert p.binding is Binding.GPU and p.step_s == pytest.approx(0.05) and p.data_wait_fraction == 0.0


def test_predict_step_consumers_and_efficiency_scale_the_data_time():
    assert predict_step(1.0, 0.01, cores=10, consumers=4).data_s == pytest.approx(0.4)
    assert predict_step(1.0, 0.01, cores=10, efficiency=0.5).data_s == pytest.approx(0.2)


def test_trainer_work_on_the_same_cores_lengthens_the_data_time():
    # 40 ms to build a batch plus 5 ms of the trainer's own work, shared by 1 or 2 cores
    assert predict_step(0.040, 0.01, cores=1, trainer_s=0.005).step_s == pytest.approx(0.045)
    assert predict_step(0.040, 0.01, cores=2, trainer_s=0.005).step_s == pytest.approx(0.0225)
    assert predict_step(0.040, 0.05, cores=2, trainer_s=0.005).binding is Binding.GPU


@pytest.mark.parametrize("kwargs, needle", [
    ({"preprocess_s": 0}, "preprocess_s"), ({"gpu_step_s": -1}, "gpu_step_s"), ({"cores": 0}, "cores"),
    ({"efficiency": 1.5}, "efficiency"), ({"consumers": 0}, "consumers"), ({"preprocess_s": float("nan")}, "nan"),
    ({"trainer_s": -0.001}, "trainer_s"), ({"trainer_s": float("nan")}, "trainer_s"),
])
def test_predict_step_rejects_bad_figures_by_name(kwargs, needle):
    args = {"preprocess_s": 1.0, "gpu_step_s": 0.1, "cores": 2, **kwargs}
    with pytest.raises(PlanError, match=needle):
        predict_step(**args)


def test_plan_recommends_the_cheapest_layout_meeting_the_target(table):
    # 1 s/batch on one core, 0.1 s GPU step, <= 5% wait: needs >= 1 / (0.1 / 0.95) = 9.5 cores.
    p = plan(table, Workload("gpu", preprocess_s=1.0, gpu_step_s=0.1, batch_size=32, epoch_samples=3200))
    small, big = {c.data_instance: c for c in p.candidates}["small"], {c.data_instance: c for c in p.candidates}["big"]
    assert (small.data_count, small.cores, small.step_s) == (3, 12, pytest.approx(0.1))   # 2 x small: 8 cores, 20% wait
    assert small.usd_per_hour == pytest.approx(7.0) and small.usd_per_step == pytest.approx(7.0 * 0.1 / 3600)
    assert (big.data_count, big.usd_per_hour) == (1, pytest.approx(6.5))
    assert p.recommended is big and big.meets_target
    assert big.usd_per_1000_steps == pytest.approx(1000 * 6.5 * 0.1 / 3600)
    assert big.usd_per_epoch == pytest.approx(100 * 6.5 * 0.1 / 3600)   # 3200 / 32 = 100 steps
    h = p.homogeneous                                                   # 8 vCPUs - 1 for the trainer
    assert (h.cores, h.step_s) == (7, pytest.approx(1 / 7))
    assert h.data_wait_fraction == pytest.approx(0.3) and not h.meets_target
    assert h.usd_per_step == pytest.approx(4.0 / 7 / 3600)
    assert [c.usd_per_step for c in p.candidates] == sorted(c.usd_per_step for c in p.candidates)


def test_cheapest_is_not_always_the_smallest_count(table):
    # target 50%: 2 x small (8 cores) meets it at 0.125 s ($6/h), but 3 x small reaches the GPU
    # bound (0.1 s, $7/h) and is cheaper per step: 7 * 0.1 < 6 * 0.125.
    p = plan(table, Workload("gpu", 1.0, 0.1, 32, data_types=("small",), target_wait=0.5))
    assert p.data_group.data_count == 3 and p.data_group.usd_per_step == pytest.approx(7 * 0.1 / 3600)
    # the GPU node alone (7 cores, 1/7 s, 30% wait, $4/h) meets 50% too, for less: 4 / 7 < 0.7
    assert p.recommended is p.homogeneous


def test_homogeneous_is_recommended_when_it_is_the_cheapest_that_meets_the_target(table):
    # 7 own cores build a batch in 0.1 / 7 s, under the 0.1 s GPU step: no data wait, $4/h;
    # 1 x small also reaches the GPU bound, for $5/h
    p = plan(table, Workload("gpu", 0.1, 0.1, 8, data_types=("small",)))
    assert p.candidates[0].meets_target and p.recommended is p.homogeneous
    assert p.to_dict()["recommended"]["data_instance"] is None
    text = format_plan(p)
    assert "| homogeneous (recommended) |" in text and "Recommended: no data group" in text
    assert "1 x small, costs 1.25x as much per 1,000 images" in text


def test_homogeneous_is_recommended_when_no_data_group_meets_the_target(table):
    # every data group is held by its NIC; the GPU node's own 7 cores keep up
    rows = dict(table.entries, small=InstancePrice("small", 1.0, 4, 0, "test", "2026-01", baseline_gbps=0.001))
    p = plan(PriceTable(rows), Workload("gpu", 0.1, 0.1, 8, data_types=("small",), bytes_per_sample=150_528))
    assert not any(c.meets_target for c in p.candidates) and p.recommended is p.homogeneous
    assert "no data group meets the target" in format_plan(p)


def test_a_data_group_cheaper_than_homogeneous_is_recommended(table):
    p = plan(table, Workload("gpu", 1.0, 0.1, 32, data_types=("small",)))
    assert not p.homogeneous.meets_target and p.recommended is p.data_group and p.recommended.data_count == 3


def test_gpus_per_instance_reserve_and_local_server(table):
    p = plan(table, Workload("gpu4", 1.0, 0.1, 32, data_types=("big",), reserve_cpus=2, local_server=True,
                             epoch_samples=1280))
    # 4 GPUs want 4 batches per step; own cores 32 - 2 * 4 = 24; GPU bound needs 40 cores.
    assert p.layouts.consumers == 4 and p.homogeneous.cores == 24
    assert p.homogeneous.step_s == pytest.approx(4 / 24)
    assert (p.recommended.data_count, p.recommended.cores) == (1, 16 + 24)
    assert p.layouts.steps_per_epoch == 10 == p.to_dict()["workload"]["steps_per_epoch"]  # 1280 / (32 * 4)


def test_no_layout_meets_the_target(table):
    p = plan(table, Workload("gpu", 100.0, 0.1, 8, max_count=2))
    assert p.recommended is None and all(c.data_count == 2 and not c.meets_target for c in p.candidates)
    assert "raise --max-count" in format_plan(p)


def test_homogeneous_enough_is_said(table):
    p = plan(table, Workload("gpu", 0.1, 0.1, 8))
    assert p.homogeneous.meets_target and "does not pay" in format_plan(p)


def test_plan_errors_name_the_bad_value(table):
    with pytest.raises(PlanError, match="known types: big, gpu, gpu4, small"):
        plan(table, Workload("gpu", 1.0, 0.1, 8, data_types=("ml.c9.huge",)))
    with pytest.raises(PlanError, match="'nope'"):
        plan(table, Workload("nope", 1.0, 0.1, 8))
    with pytest.raises(PlanError, match="target_wait"):
        plan(table, Workload("gpu", 1.0, 0.1, 8, target_wait=5))
    with pytest.raises(PlanError, match="batch_size"):
        plan(table, Workload("gpu", 1.0, 0.1, 0))


def test_real_table_reproduces_the_aws_example_homogeneous_step():
    # 1.19 s/step on one ml.p3.2xlarge (8 vCPUs, 7 preprocessing) means ~8.33 s per batch per core.
    p = plan(load_prices(), Workload("ml.p3.2xlarge", 1.19 * 7, 0.18, 512))
    assert p.homogeneous.step_s == pytest.approx(1.19)
    assert p.recommended.step_s == pytest.approx(0.18, rel=0.06) and p.recommended.meets_target
    assert p.homogeneous.usd_per_step / p.recommended.usd_per_step > 3


def test_profile_times_batches_on_one_core():
    prof = profile_pipeline("examples.synthetic:build_pipeline", {"size": 64, "batch_size": 4, "work_ms": 5},
                            batches=3)
    assert prof.batch_size == 4 and len(prof.times_s) == 4 and prof.warmup_batches == 1
    assert prof.median_s >= 0.018                                      # 4 samples x 5 ms of busy work
    assert prof.finish_s == 0.0                                        # this pipeline has no finish stage


@pytest.mark.slow  # a spawned neighbour imports torch
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs (the profile's and its neighbour's)")
def test_profile_beside_busy_cores_counts_cpu_and_leaves_no_neighbour_behind():
    import multiprocessing

    cpus = sorted(os.sched_getaffinity(0))
    prof = profile_pipeline("examples.synthetic:build_pipeline", {"size": 64, "batch_size": 4, "work_ms": 5},
                            batches=3, cpu=cpus[1], busy_cpus=cpus[:1])
    # 4 samples x 5 ms of busy work each, on one thread: CPU seconds up to the wall seconds (less where
    # another process takes turns on the core)
    assert prof.busy_cpus == cpus[:1] and prof.median_s >= 0.018 and 0 < prof.cpu_s <= prof.median_s * 1.05
    assert not [p for p in multiprocessing.active_children() if p.name == "profile-neighbour"]


def test_profile_times_the_finish_stage_too(tmp_path):
    from hetero.synthetic.images import write_image_folder

    write_image_folder(tmp_path, per_class=4, classes=2, seed=0)
    prof = profile_pipeline("data_service.pipelines.images:build_pipeline",
                            {"data_dir": str(tmp_path), "batch_size": 2, "image_size": 64}, batches=2)
    assert 0 < prof.finish_s < prof.median_s and prof.handoff_s > 0
    with pytest.raises(ValueError, match="profiling needs 20"):
        profile_pipeline("examples.synthetic:build_pipeline", {"size": 8, "batch_size": 4}, batches=19)


def test_cli_plan_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    # the AWS example's MNIST samples: float32 [1, 28, 28] and an int8 label on the wire
    rc = hetero_main(["plan", "--gpu-step-s", "0.18", "--preprocess-s", "8.33", "--batch-size", "512",
                      "--epoch-samples", "60000", "--bytes-per-sample", "3137", "--json", str(out)])
    text = "".join(capsys.readouterr())
    assert rc == 0 and "(recommended)" in text and "| homogeneous |" in text
    doc = json.loads(out.read_text())
    assert doc["recommended"]["meets_target"] and doc["homogeneous"]["data_instance"] is None


def test_cli_plan_bad_input(capsys):
    assert hetero_main(["plan", "--gpu-step-s", "0.1", "--preprocess-s", "1", "--batch-size", "8",
                        "--dnn-instance", "ml.p9.large"]) == 2
    assert "known types:" in "".join(capsys.readouterr())
    assert hetero_main(["plan", "--gpu-step-s", "0.1"]) == 2
    assert "--profile" in "".join(capsys.readouterr())
    assert hetero_main(["plan", "--gpu-step-s", "0.1", "--preprocess-s", "100", "--batch-size", "8",
                        "--max-count", "1"]) == 1


def test_cli_plan_profile(capsys):
    rc = hetero_main(["plan", "--gpu-step-s", "0.05", "--profile", "--pipeline", "examples.synthetic:build_pipeline",
                      "-o", "size=64", "-o", "work_ms=2", "--batch-size", "4", "--profile-batches", "2"])
    text = "".join(capsys.readouterr())
    assert rc in (0, 1) and "profile:" in text and "batch of 4" in text


def test_cli_plan_compare_profiles_the_changed_option_and_prices_both(capsys):
    rc = hetero_main(["plan", "--gpu-step-s", "0.002", "--profile", "--pipeline", "examples.synthetic:build_pipeline",
                      "-o", "size=64", "-o", "work_ms=1", "--batch-size", "4", "--profile-batches", "3",
                      "--compare", "work_ms=40", "--data-types", "ml.c5.xlarge"])
    text = "".join(capsys.readouterr())
    assert rc in (0, 1)
    assert "profile with work_ms=40:" in text
    line = next(x for x in text.splitlines() if x.startswith("compare: with work_ms=40"))
    # forty times the work per sample (spun on the wall clock): far more than the per-batch overhead
    # a loaded machine adds to the small profile, so the option must have reached the second profile
    ratio = float(line.split("(")[1].split("x)")[0])
    assert ratio > 2, line


def test_cli_plan_compare_needs_profile(capsys):
    assert hetero_main(["plan", "--gpu-step-s", "0.1", "--preprocess-s", "1", "--batch-size", "8",
                        "--compare", "decode=whole"]) == 2
    assert "--compare needs --profile" in "".join(capsys.readouterr())


@pytest.mark.parametrize("argv", [
    # 88 own vCPUs keep 8 A100s fed; 7 x c5.xlarge would too, at 1.04x the $ per 1,000 images
    ["--gpu-step-s", "0.3", "--preprocess-s", "0.4", "--batch-size", "256", "--dnn-instance", "ml.p4d.24xlarge",
     "--data-types", "ml.c5.xlarge"],
    # every data group is held by the g5.xlarge's 2.5 Gbps NIC; its own 3 vCPUs keep up
    ["--gpu-step-s", "0.02", "--preprocess-s", "0.05", "--batch-size", "64", "--dnn-instance", "ml.g5.xlarge",
     "--data-types", "ml.c5.xlarge,ml.c5.9xlarge"],
])
def test_cli_plan_recommends_no_data_group_when_the_gpu_node_alone_is_cheapest(argv, tmp_path, capsys):
    assert hetero_main(["plan", *argv, "--json", str(tmp_path / "p.json")]) == 0
    text = "".join(capsys.readouterr())
    assert "| homogeneous (recommended) |" in text and "Recommended: no data group" in text
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["recommended"] == doc["homogeneous"]


def test_a_negative_epoch_or_a_reserve_of_every_vcpu_is_refused(table, capsys):
    with pytest.raises(PlanError, match="epoch_samples=-5 must be an integer >= 0; 0 or left out: no"):
        plan(table, Workload("gpu", 1.0, 0.1, 8, epoch_samples=-5))
    with pytest.raises(PlanError, match=r"reserve_cpus=8 per GPU x 1 GPU\(s\) = 8 vCPUs leaves none of gpu's 8 vCPUs"):
        plan(table, Workload("gpu", 1.0, 0.1, 8, reserve_cpus=8))
    with pytest.raises(PlanError, match="reserve_cpus=8 per GPU x 4 GPU.*of gpu4's 32 vCPUs.*below 8"):
        plan(table, Workload("gpu4", 1.0, 0.1, 8, reserve_cpus=8))
    assert plan(table, Workload("gpu", 1.0, 0.1, 8, reserve_cpus=7)).homogeneous.cores == 1
    args = ["plan", "--gpu-step-s", "0.1", "--preprocess-s", "0.4", "--batch-size", "64", "--dnn-instance",
            "ml.g5.xlarge", "--data-types", "ml.c5.xlarge"]
    assert hetero_main(args + ["--epoch-samples", "-5"]) == 2
    assert "epoch_samples=-5 must be" in "".join(capsys.readouterr())
    assert hetero_main(args + ["--reserve-cpus", "100"]) == 2
    assert "reserve_cpus=100 per GPU x 1 GPU(s) = 100 vCPUs leaves none of ml.g5.xlarge's 4 vCPUs" in \
        "".join(capsys.readouterr())
