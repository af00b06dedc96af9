"""The network in the plan: NIC figures in the instance table, the binding resource, ``hetero plan``'s network."""
from __future__ import annotations

import json
import re

import pytest

from hetero.cli import main as hetero_main
from hetero.planning import cost, network
from hetero.planning.cost import InstancePrice, PriceTable, load_prices
from hetero.planning.network import wire_encoding
from hetero.planning.plan_text import format_plan
from hetero.planning.planner import Workload, plan
from launcher.capacity import Binding, PlanError, gbps_to_items

CROP = network.UINT8_CROP_BYTES


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch):
    monkeypatch.delenv(cost.ENV_VAR, raising=False)


def test_bytes_per_image_from_a_servers_stats():
    assert network.bytes_per_image_from_stats(150_528 * 64, 2, 32) == 150_528
    assert network.bytes_per_image_from_stats(0, 0, 32) is None


def test_wire_encodings_are_named_and_unknown_is_a_clear_error():
    assert wire_encoding("jpeg").name == "jpeg:90" and wire_encoding("uint8").bytes_ratio == 1.0
    assert wire_encoding(network.COMPACT).bytes_ratio <= 0.25
    with pytest.raises(PlanError, match="'webp'; use 'uint8'.*'jpeg:Q'"):
        wire_encoding("webp")
    with pytest.raises(PlanError, match="'jpeg:80' has no measured bytes ratio; known: uint8"):
        wire_encoding("jpeg:80")


def _row(name, usd, vcpus, gpus=0, base=None):
    return InstancePrice(name, usd, vcpus, gpus, "test", "2026-01", base, base, "test" if base else "", "")


@pytest.fixture
def table() -> PriceTable:
    rows = [_row("gpu", 4.0, 8, 1, base=2.5), _row("fatgpu", 8.0, 8, 1, base=100.0),
            _row("slim", 0.2, 4, base=1.25), _row("wide", 0.3, 4, base=25.0), _row("big", 1.0, 32, base=25.0)]
    return PriceTable({r.instance_type: r for r in rows}, region="test", as_of="2026-01")


# batch 100 in 0.1 s of GPU: 1,000 images/s; 125,000-byte images: 1 Gbps into the DNN node.
@pytest.mark.parametrize("dnn, types, preprocess_s, bytes_, flow, binding, count", [
    ("fatgpu", ("wide",), 1.0, 125_000, 5.0, Binding.GPU, 3),        # 400 images/s a node: cores set the count
    ("fatgpu", ("slim",), 0.01, 125_000, 5.0, Binding.GPU, 1),       # fast cores, 1.25 Gbps NIC: one node is enough
    ("fatgpu", ("slim",), 0.01, 500_000, 5.0, Binding.GPU, 4),       # 4 Gbps needed through 1.25 Gbps NICs: 4 nodes
    ("gpu", ("big",), 0.01, 500_000, 5.0, Binding.DNN_NIC, None),    # 4 Gbps needed, the DNN node takes 2.5
    ("fatgpu", ("big",), 0.01, 1_000_000, 5.0, Binding.FLOW, None),  # 8 Gbps over one flow of 5 per data node ...
    ("fatgpu", ("big",), 0.01, 1_000_000, 10.0, Binding.GPU, 1),     # ... and of 10 in a placement group
])
def test_plan_names_the_binding_resource(table, dnn, types, preprocess_s, bytes_, flow, binding, count):
    p = plan(table, Workload(dnn, preprocess_s, 0.1, 100, data_types=types, bytes_per_sample=bytes_, flow_gbps=flow,
                             max_count=1 if binding is Binding.FLOW else 16))
    best = p.candidates[0]
    assert best.binding is binding
    if count is None:
        assert p.data_group is None
    else:
        assert p.data_group.data_count == count and p.data_group.meets_target
    if preprocess_s < 0.1:  # the DNN node's own 7 cores keep up, for less than any data group
        assert p.recommended is p.homogeneous


def test_plan_flow_bound_layout_adds_nodes(table):
    p = plan(table, Workload("fatgpu", 0.01, 0.1, 100, data_types=("big",), bytes_per_sample=1_000_000, flow_gbps=5.0))
    assert p.data_group.data_count == 2 and p.data_group.binding is Binding.GPU  # two flows of 5 Gbps carry 8


def test_plan_without_bytes_counts_cores_only(table):
    p = plan(table, Workload("gpu", 0.01, 0.1, 100, data_types=("slim",)))
    assert p.data_group.data_count == 1 and p.workload.bytes_per_sample is None
    assert "not modelled" in format_plan(p)


def test_plan_costs_per_1000_images(table):
    p = plan(table, Workload("fatgpu", 1.0, 0.1, 100, data_types=("wide",), bytes_per_sample=125_000))
    r = p.recommended
    assert r.usd_per_1000_images == pytest.approx(r.usd_per_step / 100 * 1000)
    assert r.data_count == 3 and r.gbps_per_data_node == pytest.approx(1 / 3)  # 1,000 images/s of 125 kB, 3 nodes


def test_table_has_network_for_every_type_with_source_and_date():
    table = load_prices()
    for name in table.known():
        row = table.info(name)
        assert row.baseline_gbps and row.burst_gbps >= row.baseline_gbps, name
        assert row.network_source and row.network_date and row.source and row.date and row.vcpus > 0, name
    for name in ("ml.c5.2xlarge", "ml.c5n.xlarge", "ml.c6i.xlarge", "ml.m6i.xlarge", "ml.r5.xlarge",
                 "ml.p3dn.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.g4dn.xlarge", "ml.g6.xlarge",
                 "ml.g6e.xlarge"):
        assert name in table.entries
    c5 = {s: table.info(f"ml.c5.{s}").baseline_gbps for s in ("xlarge", "2xlarge", "4xlarge", "9xlarge", "18xlarge")}
    assert c5 == {"xlarge": 1.25, "2xlarge": 2.5, "4xlarge": 5.0, "9xlarge": 12.0, "18xlarge": 25.0}
    assert table.info("ml.c5.xlarge").burst_gbps == 10 and table.info("ml.g5.xlarge").baseline_gbps == 2.5
    assert table.info("ml.p5.48xlarge").gpus == 8 and table.info("ml.g6e.12xlarge").gpus == 4


def test_override_replaces_single_fields(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"instances": {"ml.c5.xlarge": {"baseline_gbps": 2.0, "network_date": "2031-01"},
                                              "ml.new.large": {"usd_per_hour": 0.1, "vcpus": 2, "baseline_gbps": 1}}}))
    table = load_prices(path)
    row = table.info("ml.c5.xlarge")
    assert (row.usd_per_hour, row.vcpus, row.baseline_gbps, row.burst_gbps) == (0.204, 4, 2.0, 2.0)
    assert row.network_source == "p.json" and row.network_date == "2031-01" and row.source != "p.json"
    assert table.info("ml.new.large").baseline_gbps == 1.0


@pytest.mark.parametrize("entry, needle", [
    ({"ml.c5.xlarge": {"baseline_gbps": -1}}, r"'ml.c5.xlarge': baseline_gbps=-1 must be a positive number; a fig"),
    ({"ml.c5.xlarge": {"burst_gbps": "fast"}}, r"burst_gbps='fast'"),
    ({"ml.c5.xlarge": {"baseline_gbps": 5, "burst_gbps": 1}}, r"burst_gbps=1.0 below baseline_gbps=5.0"),
    ({"ml.c5.xlarge": {"usd_per_hour": -2}}, r"'ml.c5.xlarge': usd_per_hour=-2.0 must be a number >= 0"),
    ({"ml.c5.xlarge": 3}, r"must be an object"),
])
def test_bad_network_figures_in_an_override_file_are_clear_errors(tmp_path, monkeypatch, capsys, entry, needle):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"instances": entry}))
    with pytest.raises(PlanError, match=needle):
        load_prices(path)
    monkeypatch.setenv(cost.ENV_VAR, str(path))
    assert hetero_main(["plan", "--gpu-step-s", "0.1", "--preprocess-s", "1", "--batch-size", "8"]) == 2
    assert "p.json" in "".join(capsys.readouterr())


MUST_SHOW = ["plan", "--dnn-instance", "ml.g5.xlarge", "--gpu-step-s", "0.1", "--preprocess-s", "0.394",
             "--batch-size", "256", "--data-types", "ml.c5.xlarge,ml.c5.4xlarge"]


def test_cli_plan_names_the_network_for_the_g5_job(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = hetero_main(MUST_SHOW + ["--json", str(out)])
    text = "".join(capsys.readouterr())
    doc = json.loads(out.read_text())
    # 256 images / 0.1 s of 150,528-byte crops is 3.08 Gbps; the g5.xlarge takes 2.5, a c5.xlarge sends 1.25
    assert rc == 1 and doc["recommended"] is None
    assert "3.08 Gbps" in text and "ml.g5.xlarge NIC (2.5 Gbps baseline)" in text and "the network binds" in text
    assert {c["binding"] for c in doc["candidates"]} == {"DNN NIC"}
    assert all(c["step_s"] > 0.12 for c in doc["candidates"])
    jpeg = next(x for x in text.splitlines() if x.startswith("with --wire jpeg:90"))
    assert "x ml.c5" in jpeg and "bound by gpu" in jpeg
    # cores only, as the plan counted before the network was modelled: one c5.xlarge looked enough
    assert hetero_main(MUST_SHOW + ["--no-network"]) == 0
    assert "Recommended: 1 x ml.c5.xlarge" in "".join(capsys.readouterr())


def test_cli_plan_measured_bytes_placement_group_and_bad_input(capsys):
    assert hetero_main(MUST_SHOW + ["--bytes-per-sample", "12800"]) == 0   # ~0.26 Gbps: cores decide
    text = "".join(capsys.readouterr())
    assert "12,800 bytes per sample" in text and "measured" in text and "with --wire" not in text
    assert hetero_main(MUST_SHOW + ["--wire", "webp"]) == 2
    assert "'webp'" in "".join(capsys.readouterr())
    assert hetero_main(MUST_SHOW + ["--bytes-per-sample", "-5"]) == 2
    assert "--bytes-per-sample=-5.0 must be a positive number" in "".join(capsys.readouterr())
    assert hetero_main(MUST_SHOW + ["--placement-group", "--json", "/dev/null"]) == 1
    assert "10 Gbps per flow" in "".join(capsys.readouterr())


def test_bench_report_takes_bytes_from_the_data_servers_and_names_the_binding(tmp_path):
    from hetero.bench import report as bench_report
    from hetero.bench.records import BenchConfig, RunResult
    from hetero.bench.summary import add_network, summarize

    def run(mode, rnd, step, nodes):
        metrics = {"avg_step_time_s": step, "data_wait_fraction": 0.1, "samples_per_s": 256 / step, "steps": 50,
                   "warmup_steps_discarded": 5, "step_kind": "emulated", "nodes": nodes}
        return RunResult(mode, rnd, True, 10.0, metrics, [], {}, [step], 0.0)

    sent = [{"host": "algo-2", "role": "data", "bytes_sent": 150_528 * 256 * 10, "batches_sent": 10}]
    runs = [run("homogeneous", 0, 0.2, []), run("heterogeneous", 0, 0.1, sent)]
    cfg = BenchConfig([0], [1], batch_size=256, output=tmp_path, emulate_step_s=0.1,
                      dnn_instance="ml.g5.xlarge", data_instance="ml.c5.xlarge")
    s = summarize(cfg, runs)
    add_network(cfg, s, load_prices(), runs, preprocess_s=0.394, profiled_bytes=99.0)
    net = s["network"]
    assert net["bytes_per_sample"] == 150_528 and net["bytes_source"].startswith("measured")
    assert net["heterogeneous_gbps_here"] == pytest.approx(3.08, abs=0.01)
    assert net["aws"]["binding"] is Binding.DATA_NIC   # one c5.xlarge: 1.25 Gbps of the 3.08 the GPU takes
    line = bench_report.network_line(net)
    assert "150,528 bytes per sample" in line and "bound by data NIC" in line
    add_network(cfg, s, load_prices(), [runs[0]], preprocess_s=0.394, profiled_bytes=4_000.0)
    assert s["network"]["bytes_source"] == "the profiled batches' tensors"
    assert s["network"]["aws"]["binding"] is Binding.GPU


# -- the live advice (launcher/advice/model.py): the same model with the window's figures --------------------------
def _live(servers, bytes_per_batch, data_nic=None, dnn_nic=None, flow=None, ranks=1, step=0.2, wait=0.1):
    from launcher.advice.model import LiveFigures

    return LiveFigures(step, wait, ranks, tuple(servers), 1000, "ml.c5.xlarge", "ml.g5.xlarge", 1,
                       bytes_per_batch=bytes_per_batch, data_nic_gbps=data_nic, dnn_nic_gbps=dnn_nic,
                       flow_gbps=flow, batch_size=100)


# One batch of 100 x 125,000 bytes is 0.1 Gb: 1 Gbps carries 10 batches/s. Compute 0.1 s: the rank takes 10/s,
# 11 with the advice's 10 % headroom. Each data node's cores could make 20 batches/s (2 built at 10 % busy).
@pytest.mark.parametrize("case, nic, dnn, flow, change, binding", [
    ("cores", 10.0, None, None, 0, Binding.CORES),         # 20/s a node (100/s through its NIC): one covers 11/s
    ("data NIC", 0.25, None, None, 4, Binding.DATA_NIC),   # 2.5/s a node: 5 nodes for 11/s
    ("flow", None, None, 0.5, 2, Binding.FLOW),            # one rank's flow 5/s a node: 3 nodes
    ("DNN NIC", 0.25, 0.5, None, 1, Binding.DNN_NIC),      # the DNN takes 5/s: 2 nodes reach it, more do not help
])
def test_live_advice_names_the_binding_resource(case, nic, dnn, flow, change, binding):
    from launcher.advice.model import ServerFigures, advise
    from launcher.metric_lines import advice_line

    a = advise(_live([ServerFigures("d1:6000", 2.0, 0.1, built_per_s=2.0)], 12_500_000, nic, dnn, flow))
    assert a.change == change and a.binding is binding, case
    assert a.bytes_per_sample == 125_000
    line = advice_line(40, a.to_dict())
    assert f"bound by {binding} at 125,000 bytes per sample" in line
    if binding is Binding.DNN_NIC:
        assert "cannot raise" in line and "jpeg:90" in line and a.predicted_step_s == pytest.approx(0.2)
    if binding is Binding.DATA_NIC:
        assert "c5n" in line


def test_live_advice_without_network_figures_is_unchanged():
    from launcher.advice.model import ServerFigures, advise
    from launcher.metric_lines import advice_line

    a = advise(_live([ServerFigures("d1:6000", 2.0, 0.1, built_per_s=2.0)], None, 0.25, 0.5, 0.5))
    assert a.change == 0 and a.bytes_per_sample is None and a.binding is None
    a = advise(_live([ServerFigures("d1:6000", 2.0, 0.1, built_per_s=2.0)], 12_500_000))  # bytes, no NIC figure
    assert a.change == 0 and a.binding is None and "bound by" not in advice_line(40, a.to_dict())


def test_advisor_measures_bytes_per_batch_between_snapshots_of_data_nodes_only():
    from launcher.advice.advisor import Snapshot, window_bytes_per_batch

    before = {"a": Snapshot(100, 10, 0.5, 10, 1000), "own": Snapshot(100, 10, 0.5, 10, 1000)}
    after = {"a": Snapshot(110, 30, 0.5, 30, 5000), "own": Snapshot(110, 40, 0.5, 40, 9_000_000),
             "new": Snapshot(5, 5, 0.5, 5, 500)}
    assert window_bytes_per_batch(before, after, {"a": True, "own": False, "new": True}) == 200
    assert window_bytes_per_batch({}, after, {}) is None


def test_advice_network_hyperparameter_and_its_check():
    from data_service.errors import ConfigError
    from hetero.sagemaker.jobs import add_advice_figures
    from launcher.config import LaunchConfig

    hp: dict = {}
    add_advice_figures(hp, ["ml.c5.xlarge", "ml.g5.xlarge", "ml.unknown"])
    assert json.loads(hp["advice_network"]) == {"ml.c5.xlarge": 1.25, "ml.g5.xlarge": 2.5}
    with pytest.raises(ConfigError, match="advice_network=.*must be NIC baselines in Gbps"):
        LaunchConfig.from_hyperparameters({"advice_network": '{"ml.c5.xlarge": -1}'})
    with pytest.raises(ConfigError, match="advice_flow_gbps=-1"):
        LaunchConfig.from_hyperparameters({"advice_flow_gbps": -1})
    cfg = LaunchConfig.from_hyperparameters({"advice_network": hp["advice_network"], "advice_flow_gbps": "10"})
    assert cfg.advice.advice_network["ml.g5.xlarge"] == 2.5 and cfg.advice.advice_flow_gbps == 10


# -- the sizing table (hetero/planning/sizing.py, hetero plan --sizing) ----------------------------------------
def test_sizing_table_rows_and_the_network_they_name():
    from hetero.planning.sizing import IMAGENET_TRAIN_IMAGES, sizing

    table = load_prices()
    rows = {(r.model.split()[0], r.dnn_instance, r.wire): r for r in sizing(table)}
    r50 = rows[("ResNet-50", "ml.p3.2xlarge", "uint8")]
    assert r50.demand_images_s == 1200 and r50.meets_target and r50.binding is Binding.GPU
    assert r50.usd_per_epoch == pytest.approx(r50.usd_per_hour * IMAGENET_TRAIN_IMAGES / 1200 / 3600)
    assert rows[("ResNet-50", "ml.p4d.24xlarge", "uint8")].demand_images_s == pytest.approx(8 * 2470)
    # a light model on one V100 takes 4,800 images/s: 5.8 Gbps of uint8 through a 2.5 Gbps NIC; jpeg:90 fits
    light = rows[("light", "ml.p3.2xlarge", "uint8")]
    assert light.binding is Binding.DNN_NIC and not light.meets_target
    assert light.images_per_s == pytest.approx(gbps_to_items(2.5, CROP))
    assert rows[("light", "ml.p3.2xlarge", "jpeg:90")].meets_target
    assert not any(k[1].startswith("ml.g5") for k in rows)   # no published rate for the A10G: left out


def test_cli_plan_sizing(capsys, tmp_path):
    assert hetero_main(["plan", "--sizing", "--per-core-rate", "735", "--json", str(tmp_path / "s.json")]) == 0
    text = "".join(capsys.readouterr())
    assert "735 images/s per vCPU (given with --per-core-rate)" in text and "| ml.p4d.24xlarge | 8 | jpeg:90 |" in text
    assert len(json.loads((tmp_path / "s.json").read_text())) == 24
    assert hetero_main(["plan", "--sizing", "--per-core-rate", "0"]) == 2
    assert "--per-core-rate=0.0 must be a positive number" in "".join(capsys.readouterr())
    assert hetero_main(["plan", "--preprocess-s", "1", "--batch-size", "8"]) == 2
    assert "--gpu-step-s" in "".join(capsys.readouterr())


def test_a_network_bound_data_group_beside_a_self_sufficient_gpu_node_says_so(table):
    p = plan(table, Workload("gpu", 0.01, 0.1, 100, data_types=("big",), bytes_per_sample=500_000))
    assert p.data_group is None and p.recommended is p.homogeneous
    assert "Recommended: no data group" in format_plan(p)


def test_cli_plan_profile_takes_the_bytes_of_the_batches_it_built(capsys):
    rc = hetero_main(["plan", "--gpu-step-s", "0.05", "--profile", "--pipeline", "examples.synthetic:build_pipeline",
                      "-o", "size=64", "-o", "work_ms=1", "--batch-size", "4", "--profile-batches", "2"])
    text = "".join(capsys.readouterr())
    assert rc in (0, 1) and "72 bytes per sample built" in text
    assert "72 bytes per sample on the wire (wire uint8; the profiled batches' tensors)" in text


def test_cli_plan_prices_only_encodings_more_compact_than_the_jobs(capsys):
    assert hetero_main(MUST_SHOW + ["--wire", "up-zstd", "--bytes-per-sample", "300000"]) == 1
    text = "".join(capsys.readouterr())
    assert "with --wire jpeg:90" in text and "with --wire up-zstd" not in text
    # measured with up-zstd: jpeg:90 carries 0.085 / 0.53 of those bytes
    assert "0.088 of uint8's bytes" in text
    assert hetero_main(MUST_SHOW + ["--wire", "jpeg:85", "--bytes-per-sample", "300000"]) == 1
    assert "with --wire" not in "".join(capsys.readouterr())


def test_cli_plan_reads_the_bytes_a_finished_job_measured(tmp_path, capsys):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"wire_encoding": "jpeg:90", "pipeline_options": {"batch_size": 256}, "nodes": [
        {"role": "dnn", "host": "algo-1"},
        {"role": "data", "host": "algo-2", "bytes_sent": 13_000 * 256 * 40, "batches_sent": 40}]}))
    assert hetero_main(MUST_SHOW + ["--metrics", str(path)]) == 0
    text = "".join(capsys.readouterr())
    assert "13,000 bytes per sample on the wire (wire jpeg:90; measured by the data servers of metrics.json)" in text
    path.write_text(json.dumps({"nodes": [{"role": "dnn"}]}))
    assert hetero_main(MUST_SHOW + ["--metrics", str(path)]) == 2
    assert "no data node with bytes_sent" in "".join(capsys.readouterr())
    assert hetero_main(MUST_SHOW + ["-o", "image_size=112", "--json", "/dev/null"]) == 0  # 37,632 bytes: 0.77 Gbps
    assert "37,632 bytes per sample" in "".join(capsys.readouterr())


def test_cli_plan_takes_measured_bytes_for_a_jpeg_quality_without_a_stored_ratio(tmp_path, capsys):
    assert hetero_main(MUST_SHOW + ["--wire", "jpeg:80", "--bytes-per-sample", "12000"]) == 0
    assert "12,000 bytes per sample on the wire (wire jpeg:80; measured" in "".join(capsys.readouterr())
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"wire_encoding": "JPEG:80", "pipeline_options": {"batch_size": 256}, "nodes": [
        {"role": "data", "host": "algo-2", "bytes_sent": 12_000 * 256 * 40, "batches_sent": 40}]}))
    assert hetero_main(MUST_SHOW + ["--metrics", str(path)]) == 0
    assert "12,000 bytes per sample on the wire (wire jpeg:80; measured by" in "".join(capsys.readouterr())
    # with no bytes measured there is nothing to size jpeg:80 by
    assert hetero_main(MUST_SHOW + ["--wire", "jpeg:80"]) == 2
    assert "'jpeg:80' has no measured bytes ratio" in "".join(capsys.readouterr())


def test_wire_names_are_read_in_any_case_as_the_pipelines_read_them(capsys):
    assert wire_encoding("JPEG:90") is wire_encoding("jpeg:90") is wire_encoding(" Jpeg ")
    assert wire_encoding("jpeg:80", bytes_measured=True).bytes_ratio is None
    assert hetero_main(MUST_SHOW + ["--wire", "JPEG:90"]) == 0
    assert "(wire jpeg:90; assumed" in "".join(capsys.readouterr())
    for bad in ("jpeg:\u00b2", "jpeg:0"):
        with pytest.raises(PlanError, match="must be an integer in 1..100"):
            wire_encoding(bad, bytes_measured=True)


@pytest.mark.parametrize("nodes, options, field", [
    ([{"host": "algo-2", "bytes_sent": "12", "batches_sent": 4}], {"batch_size": 2}, "bytes_sent of node algo-2='12'"),
    ([{"host": "algo-2", "bytes_sent": 12, "batches_sent": 4.5}], {"batch_size": 2}, "batches_sent of node algo-2=4.5"),
    ([{"host": "algo-2", "bytes_sent": 12, "batches_sent": 4}], {"batch_size": "2"}, "pipeline_options.batch_size='2'"),
])
def test_a_bad_field_of_a_metrics_file_is_named(tmp_path, nodes, options, field):
    from hetero.planning.network import metrics_bytes

    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"pipeline_options": options, "nodes": nodes}))
    with pytest.raises(PlanError, match=re.escape(f"--metrics {path}: {field} must be an integer >= 0; a JSON integer")):
        metrics_bytes(path, None)


def test_cli_plan_names_a_bad_field_of_a_metrics_file(tmp_path, capsys):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"nodes": [{"host": "algo-2", "bytes_sent": "12", "batches_sent": 4}]}))
    assert hetero_main(MUST_SHOW + ["--metrics", str(path)]) == 2
    assert f"hetero plan: --metrics {path}: bytes_sent of node algo-2='12' must be" in "".join(capsys.readouterr())


def test_multi_card_gpu_types_are_sized_on_the_one_card_tcp_uses():
    table = load_prices()
    for name, cards, total in (("ml.p4d.24xlarge", 4, 400), ("ml.p4de.24xlarge", 4, 400), ("ml.p5.48xlarge", 32, 3200)):
        row = table.info(name)
        assert row.baseline_gbps == row.burst_gbps == 100.0 and row.network_date == "2026-11"
        assert f"{total:,} Gbps / {cards} cards" in row.network_source and "EFA" in row.network_source
    # 8 A100s taking 120,000 images/s of 150,528 bytes want 144 Gbps: more than one card carries
    p = plan(table, Workload("ml.p4d.24xlarge", 0.01, 256 / 15_000, 256, data_types=("ml.c5n.18xlarge",),
                             max_count=16, bytes_per_sample=150_528))
    assert p.candidates[0].binding is Binding.DNN_NIC and not p.candidates[0].meets_target
