"""Properties of the planner (hetero/planning/planner.py) over generated instance tables and workloads.

Each example builds a small price table (one GPU type, one to three CPU types, NICs known or not)
and a workload, plans it, and checks the plan against every layout worked out here one by one.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict

from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.planning.cost import InstancePrice, PriceTable
from hetero.planning.plan_text import format_plan
from hetero.planning.planner import Workload, plan, predict_network_step, predict_step
from launcher.capacity import gbps_to_items

FAST = settings(max_examples=300, deadline=None)
TOL = 1e-9

gbps = st.one_of(st.none(), st.floats(0.5, 400.0))


@st.composite
def tables(draw) -> tuple[PriceTable, list[str]]:
    gpus = draw(st.integers(1, 8))
    rows = [InstancePrice("dnn", draw(st.floats(0.5, 120.0)), draw(st.integers(gpus + 1, 192)), gpus, "test",
                          "2026-01", baseline_gbps=draw(gbps))]
    names = []
    for i in range(draw(st.integers(1, 3))):
        names.append(f"cpu{i}")
        rows.append(InstancePrice(f"cpu{i}", draw(st.floats(0.05, 6.0)), draw(st.integers(2, 96)), 0, "test",
                                  "2026-01", baseline_gbps=draw(gbps)))
    return PriceTable({r.instance_type: r for r in rows}, region="test", as_of="2026-01"), names


FIELDS = {
    "preprocess_s": st.floats(0.001, 5.0),
    "gpu_step_s": st.floats(0.005, 1.0),
    "batch_size": st.integers(1, 512),
    "dnn_count": st.integers(1, 3),
    "max_count": st.integers(1, 8),
    "target_wait": st.floats(0.0, 0.5),
    "efficiency": st.floats(0.3, 1.0),
    "local_server": st.booleans(),
    "bytes_per_sample": st.one_of(st.none(), st.floats(100.0, 1e6)),
    "encode_s": st.sampled_from([0.0, 0.00024]),
    "flow_gbps": st.sampled_from([None, 5.0, 10.0]),
    "goodput": st.floats(0.5, 1.0),
    "epoch_samples": st.sampled_from([0, 1_281_167]),
}
workloads = st.fixed_dictionaries(FIELDS)
networked = st.fixed_dictionaries({**FIELDS, "bytes_per_sample": st.floats(100.0, 1e6)})


def _own(table: PriceTable, w: dict) -> int:
    dnn = table.info("dnn")
    return w["dnn_count"] * (dnn.vcpus - dnn.gpus)  # reserve_cpus=1 per GPU, the default


def _step(table: PriceTable, w: dict, data_type: str, n: int) -> float:
    """The step of the DNN group fed by ``n`` nodes of ``data_type``, worked out here."""
    dnn, row = table.info("dnn"), table.info(data_type)
    consumers = w["dnn_count"] * dnn.gpus
    own = _own(table, w) if w["local_server"] else 0
    if w["bytes_per_sample"] is None:
        return predict_step(w["preprocess_s"], w["gpu_step_s"], n * row.vcpus + own, consumers, w["efficiency"]).step_s
    return predict_network_step(w["preprocess_s"], w["gpu_step_s"], w["batch_size"], consumers, row.vcpus, n,
                                w["bytes_per_sample"], row.baseline_gbps, dnn.baseline_gbps, w["dnn_count"],
                                w["flow_gbps"], w["encode_s"], w["efficiency"], own, w["goodput"]).step_s


def _layouts(table: PriceTable, names: list[str], w: dict) -> list[tuple[int, float, float]]:
    """(data nodes, step, $ per 1,000 images) of every layout: the DNN group alone, then each type and count."""
    dnn = table.info("dnn")
    images = w["batch_size"] * w["dnn_count"] * dnn.gpus
    homo = predict_step(w["preprocess_s"], w["gpu_step_s"], _own(table, w), w["dnn_count"] * dnn.gpus,
                        w["efficiency"]).step_s
    out = [(0, homo, w["dnn_count"] * dnn.usd_per_hour * homo / 3600 * 1000 / images)]
    for name in names:
        for n in range(1, w["max_count"] + 1):
            step = _step(table, w, name, n)
            hourly = w["dnn_count"] * dnn.usd_per_hour + n * table.info(name).usd_per_hour
            out.append((n, step, hourly * step / 3600 * 1000 / images))
    return out


def _plan(table: PriceTable, names: list[str], w: dict):
    return plan(table, Workload("dnn", data_types=tuple(names), **w))


@FAST
@given(tables(), workloads)
def test_the_recommendation_is_the_cheapest_layout_that_meets_the_target(tn, w):
    table, names = tn
    p = _plan(table, names, w)
    meeting = [cost for _, step, cost in _layouts(table, names, w)
               if (step - w["gpu_step_s"]) / step <= w["target_wait"] + 1e-12]
    if not meeting:
        assert p.recommended is None
        return
    assert p.recommended is not None and p.recommended.meets_target
    assert p.recommended.usd_per_1000_images <= min(meeting) * (1 + TOL)
    if p.homogeneous.meets_target:
        assert p.recommended.usd_per_1000_images <= p.homogeneous.usd_per_1000_images * (1 + TOL)


@FAST
@given(tables(), networked)
def test_no_layout_is_predicted_faster_than_a_nic_on_its_path_carries(tn, w):
    table, names = tn
    p = _plan(table, names, w)
    dnn = table.info("dnn")
    consumers = w["dnn_count"] * dnn.gpus
    per_core = w["batch_size"] / (w["preprocess_s"] + w["batch_size"] * w["encode_s"])
    local = _own(table, w) * w["efficiency"] * per_core if w["local_server"] else 0.0
    for o in p.candidates:
        row = table.info(o.data_instance)
        # images the data nodes send: all the GPUs take, less what the DNN nodes' own servers can build
        sent = max(0.0, consumers * w["batch_size"] / o.step_s - local)
        carry = lambda g: gbps_to_items(g, w["bytes_per_sample"], w["goodput"])  # noqa: E731
        if row.baseline_gbps is not None:
            assert sent <= o.data_count * carry(row.baseline_gbps) * (1 + TOL)
            # the Gbps the plan prints for each data node fit through its NIC too
            assert o.gbps_per_data_node <= row.baseline_gbps * w["goodput"] * (1 + TOL)
        if dnn.baseline_gbps is not None:
            assert sent <= w["dnn_count"] * carry(dnn.baseline_gbps) * (1 + TOL)
        if w["flow_gbps"] is not None:
            assert sent <= o.data_count * consumers * carry(w["flow_gbps"]) * (1 + TOL)


@FAST
@given(tables(), workloads)
def test_adding_data_nodes_never_predicts_a_slower_step(tn, w):
    table, names = tn
    for name in names:
        steps = [_step(table, w, name, n) for n in range(1, w["max_count"] + 2)]
        assert all(b <= a * (1 + TOL) for a, b in zip(steps, steps[1:]))


NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")


@FAST
@given(tables(), workloads)
def test_every_figure_of_the_plan_is_finite_and_not_negative(tn, w):
    table, names = tn
    p = _plan(table, names, w)
    text = format_plan(p)
    assert not re.search(r"\b(nan|inf)\b", text, re.IGNORECASE)
    for figure in NUMBER.findall(text):
        value = float(figure.replace(",", ""))
        assert math.isfinite(value) and value >= 0, (figure, text)
    for option in (p.homogeneous, *p.candidates):
        for key, value in asdict(option).items():
            if isinstance(value, float):
                assert math.isfinite(value) and value >= 0, (key, value)
