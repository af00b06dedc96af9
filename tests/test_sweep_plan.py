"""A sweep's price (hetero/planning/sweep_cost.py, ``hetero plan --jobs N``): N data groups against
one shared by all, by hand on round prices and as properties over generated workloads."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.cli import main as hetero_main
from hetero.planning.cost import InstancePrice, PriceTable
from hetero.planning.planner import PlanError, Workload, plan
from launcher.capacity import Binding
from hetero.planning.sweep_cost import format_sweep, sweep_prices


def _table(gpu_usd: float = 4.0, cpu_usd: float = 1.0, vcpus: int = 4, gbps: float | None = None) -> PriceTable:
    rows = [InstancePrice("gpu", gpu_usd, 8, 1, "test", "2026-01", baseline_gbps=gbps),
            InstancePrice("cpu", cpu_usd, vcpus, 0, "test", "2026-01", baseline_gbps=gbps)]
    return PriceTable({r.instance_type: r for r in rows}, region="test", as_of="2026-01")


def test_a_shared_group_feeds_n_jobs_at_the_same_step_for_a_share_of_its_price():
    table = _table()
    # 0.4 s a batch on one core, a 0.1 s step: one job needs 4 cores, one "cpu" node
    one = plan(table, Workload("gpu", 0.4, 0.1, 32, data_types=("cpu",), reserve_cpus=7, epoch_samples=32_000))
    rows = sweep_prices(one, jobs=4)
    separate, within, apart, sized = rows
    assert separate.data_nodes == 4 and within.data_nodes == apart.data_nodes == 1
    assert separate.step_s == within.step_s == 0.1 and within.meets_target
    # each job: its GPU ($4/h) + all of a node ($1/h) separately, or a quarter of it shared
    assert separate.usd_per_job_1000_steps == pytest.approx(5.0 * 0.1 / 3.6)
    assert within.usd_per_job_1000_steps == pytest.approx(4.25 * 0.1 / 3.6)
    assert within.usd_per_job_epoch == pytest.approx(1000 * 4.25 * 0.1 / 3600)  # 1,000 steps an epoch
    assert within.usd_per_hour == pytest.approx(17.0) and separate.usd_per_hour == pytest.approx(20.0)
    # apart, every batch is built for each job: 4 jobs' work on 4 cores
    assert apart.step_s == pytest.approx(0.4) and not apart.meets_target
    assert sized.data_nodes == 4 and sized.step_s == pytest.approx(0.1)
    text = format_sweep(rows, 4)
    # 4.25 against 5.00 $/h per job at the same step: 0.85x the price, 1.18x cheaper (not "1.18x less")
    assert ("Shared within the window: each job costs 0.85x as much as with separate groups ($0.1181 against "
            "$0.1389 per job per 1000 steps, 1.18x cheaper)") in text
    assert "sized for jobs apart, 4 x" not in text  # the group of 1 meets the target within the window


def test_a_shared_nic_carrying_n_jobs_bytes_can_cost_more_and_says_so():
    table = _table(gbps=1.0)  # 1 Gbps NICs: one node cannot send 4 jobs' batches in time
    one = plan(table, Workload("gpu", 0.01, 0.1, 32, data_types=("cpu",), reserve_cpus=7, bytes_per_sample=150_528))
    rows = sweep_prices(one, jobs=4)
    assert rows[1].binding is Binding.DATA_NIC and rows[1].step_s > rows[0].step_s
    text = format_sweep(rows, 4)
    ratio = rows[1].usd_per_job_1000_steps / rows[0].usd_per_job_1000_steps
    assert ratio > 1 and f"each job costs {ratio:.2f}x as much as with separate groups" in text
    shared = next(line for line in text.splitlines() if line.startswith("Shared within the window:"))
    assert shared.endswith(f"dearer), each job's step {rows[1].step_s:.4f} s against {rows[0].step_s:.4f} s "
                           "(binding: data NIC).") and "cheaper" not in shared


@pytest.mark.parametrize("jobs", [0, 1, -3, 2.5])
def test_a_sweep_needs_two_jobs_or_more(jobs):
    table = _table()
    one = plan(table, Workload("gpu", 0.4, 0.1, 32, data_types=("cpu",), reserve_cpus=7))
    with pytest.raises(PlanError, match=r"jobs=.* must be an integer >= 2"):
        sweep_prices(one, jobs)


def test_hetero_plan_jobs_prints_the_sweep(capsys):
    code = hetero_main(["plan", "--gpu-step-s", "0.2", "--preprocess-s", "1.0", "--batch-size", "256",
                        "--dnn-instance", "ml.g5.xlarge", "--data-types", "ml.c5.4xlarge", "--no-network",
                        "--jobs", "4"])
    out = capsys.readouterr().out
    assert code == 0 and "Sweep of 4 jobs" in out and "4 separate groups of 1 x ml.c5.4xlarge" in out
    assert hetero_main(["plan", "--gpu-step-s", "0.2", "--preprocess-s", "1.0", "--batch-size", "256",
                        "--data-types", "ml.c5.4xlarge", "--no-network", "--jobs", "0"]) == 2
    assert "hetero plan: --jobs 0: jobs=0 must be an integer >= 2" in capsys.readouterr().err


@settings(max_examples=200, deadline=None)
@given(p=st.floats(0.01, 4.0), gpu=st.floats(0.01, 1.0), jobs=st.integers(2, 16), vcpus=st.integers(2, 96),
       gpu_usd=st.floats(0.5, 40.0), cpu_usd=st.floats(0.05, 6.0))
def test_shared_within_the_window_is_never_slower_or_dearer_per_job_and_apart_never_faster(
        p, gpu, jobs, vcpus, gpu_usd, cpu_usd):
    table = _table(gpu_usd, cpu_usd, vcpus)
    one = plan(table, Workload("gpu", p, gpu, 32, data_types=("cpu",), reserve_cpus=7, max_count=64))
    separate, within, apart, *sized = sweep_prices(one, jobs, max_count=256)
    assert math.isclose(within.step_s, separate.step_s)  # batches built once: the cores build one job's
    assert within.usd_per_job_1000_steps < separate.usd_per_job_1000_steps
    assert apart.step_s >= within.step_s - 1e-12
    for row in sized:
        assert row.meets_target and row.data_nodes > within.data_nodes


@settings(max_examples=150, deadline=None)
@given(preprocess_s=st.floats(0.01, 10.0), gpu_step_s=st.floats(0.01, 1.0), batch_size=st.integers(1, 512),
       dnn=st.sampled_from(["ml.p3.2xlarge", "ml.g5.xlarge", "ml.g5.12xlarge", "ml.p4d.24xlarge"]),
       dnn_count=st.integers(1, 3), local_server=st.booleans(), reserve_cpus=st.integers(0, 1),
       bytes_per_sample=st.one_of(st.none(), st.floats(1e3, 1e6)), jobs=st.integers(2, 8),
       data_type=st.sampled_from(["ml.m5.large", "ml.c5.xlarge", "ml.c5.9xlarge", "ml.c5n.4xlarge"]))
def test_the_separate_groups_row_is_n_times_the_plans_own_row(preprocess_s, gpu_step_s, batch_size, dnn, dnn_count,
                                                              local_server, reserve_cpus, bytes_per_sample, jobs,
                                                              data_type):
    """The sweep's "separate groups" row is N copies of the plan's own layout: the same step, wait and
    binding, N x its data nodes and $/h, and per job what the plan's row costs (its DNN nodes' own
    cores serving too, with local_server)."""
    from hetero.planning.cost import load_prices

    table = load_prices()
    one = plan(table, Workload(dnn, preprocess_s, gpu_step_s, batch_size, dnn_count=dnn_count, data_types=(data_type,),
                               max_count=8, local_server=local_server, reserve_cpus=reserve_cpus,
                               bytes_per_sample=bytes_per_sample))
    group = one.data_group or next(c for c in one.candidates if c.data_instance)
    separate = sweep_prices(one, jobs, max_count=8)[0]
    assert separate.step_s == pytest.approx(group.step_s, rel=1e-9)
    assert separate.data_wait_fraction == pytest.approx(group.data_wait_fraction, rel=1e-9, abs=1e-12)
    assert separate.binding is group.binding
    assert separate.data_nodes == jobs * group.data_count
    assert separate.usd_per_hour == pytest.approx(jobs * group.usd_per_hour, rel=1e-9)
    assert separate.usd_per_job_1000_steps == pytest.approx(group.usd_per_1000_steps, rel=1e-9)
    assert separate.meets_target == group.meets_target


def test_the_plan_command_prices_separate_groups_at_its_own_step(capsys):
    """hetero plan ... --local-server --jobs 4: the plan's row and the separate groups' row agree."""
    assert hetero_main(["plan", "--gpu-step-s", "0.2", "--preprocess-s", "4.0", "--batch-size", "256", "--jobs", "4",
                        "--local-server"]) == 0
    out = capsys.readouterr().out
    recommended = next(line for line in out.splitlines() if line.startswith("Recommended:"))
    separate = next(line for line in out.splitlines() if line.startswith("| 4 separate groups"))
    step = recommended.split("predicted ")[1].split(" s/step")[0]
    assert separate.split(" | ")[2] == step, (recommended, separate)
