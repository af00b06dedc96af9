"""The capacity model (launcher/capacity.py): hand-worked layouts, and plan and advice agreeing on the same job.

The property builds a job from a profile (per-batch cost, cores, data nodes, NICs, the DNN host's own
server, prices), asks the planner (``hetero plan``'s per-layout prediction) for its step, writes down what
that job's rank 0 would measure in its steady state (each server's batches/s and busy share, the
step, the data wait, the bytes per batch), and asks the live advice. Both must give the same capacity,
and for the advised number of data nodes the same step and the same $ per epoch.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hetero.planning.cost import InstancePrice, PriceTable
from hetero.planning.planner import predict_network_step, predict_step
from launcher import capacity
from launcher.advice.model import LiveFigures, ServerFigures, advise
from launcher.capacity import Binding, Layout, Network, OwnCores, PlanError, predict

EXAMPLES = 400


def test_cores_alone_pool_the_trainers_work():
    # a homogeneous node: 2 cores, 100 ms a batch, the trainer's finish stage 20 ms a batch on the same cores
    p = predict(Layout(1, 0.02, own=OwnCores(2.0, 0.100, trainer_s=0.020, serves=True)))
    assert p.data_s == pytest.approx(0.120 / 2) and p.binding is Binding.CORES
    assert p.data_wait_fraction == pytest.approx((0.060 - 0.020) / 0.060)


def test_a_trainer_core_that_serves_builds_less_than_a_whole_core():
    # one data node of one core (10 batches/s) beside the trainer's own core, which builds at 100 ms a batch
    # and spends 20 ms on every batch the trainer takes, whoever built it
    own = OwnCores(1.0, 0.100, trainer_s=0.020, serves=True)
    p = predict(Layout(1, 0.02, (10.0,), own))
    # delivered = 10 + (1 - delivered x 0.020) / 0.100  ->  (10 x 0.100 + 1) / 0.120
    assert p.items_s == pytest.approx(2.0 / 0.120) and p.local_items_s == pytest.approx(2.0 / 0.120 - 10.0)
    assert p.local_items_s < 1 / 0.100                    # fewer than the core alone would build
    # a trainer's core that other processes take half of builds fewer still
    half = predict(Layout(1, 0.02, (10.0,), OwnCores(0.5, 0.100, trainer_s=0.020, serves=True)))
    assert half.items_s == pytest.approx(1.5 / 0.120)


def test_without_its_own_server_the_trainers_work_can_bind():
    own = OwnCores(1.0, 0.100, trainer_s=0.050)
    p = predict(Layout(1, 0.01, (40.0,), own))
    assert p.binding is Binding.TRAINER and p.step_s == pytest.approx(0.050)
    assert predict(Layout(1, 0.01, (10.0,), own)).binding is Binding.CORES   # 10 batches/s: the data node binds


def test_the_network_binds_per_node_and_at_the_dnn_nodes():
    net = Network(bytes_per_item=1e6, data_nic_gbps=1.0, dnn_nic_gbps=4.0, flow_gbps=5.0)  # 125 / 500 / 625 per s
    assert capacity.remote(Layout(1, 0.01, (100.0, 100.0), network=net)).binding is Binding.CORES
    one = capacity.remote(Layout(1, 0.01, (200.0, 200.0), network=net))
    assert one.binding is Binding.DATA_NIC and one.items_s == pytest.approx(250.0)
    many = capacity.remote(Layout(1, 0.01, (120.0,) * 6, network=net))
    assert many.binding is Binding.DNN_NIC and many.items_s == pytest.approx(500.0)
    assert many.nodes_s == pytest.approx(720.0)
    # the DNN host's own server sends over no NIC
    p = predict(Layout(1, 0.001, (120.0,) * 6, OwnCores(50.0, serves=True), net))
    assert p.items_s == pytest.approx(550.0) and p.local_items_s == pytest.approx(50.0) and p.binding is Binding.DNN_NIC
    # the data NICs and the DNN NIC carry alike: the DNN NIC, which more data nodes cannot lift
    assert capacity.remote(Layout(1, 0.01, (200.0,) * 4, network=net)).binding is Binding.DNN_NIC


# (case, one data node's items/s, data nodes, network, ranks, DNN nodes, binding, items/s delivered): each
# worked out by hand; 1 Gbps of 125,000-byte items is 1,000 items/s.
KB125 = 125_000
CASES = [
    ("cores", 400.0, 1, Network(KB125, 10), 1, 1, Binding.CORES, 400),
    ("data NIC", 1600.0, 1, Network(KB125, 1.25), 1, 1, Binding.DATA_NIC, 1250),
    ("DNN NIC", 1600.0, 4, Network(KB125, 5, 2.5), 1, 1, Binding.DNN_NIC, 2500),
    ("flow", 9600.0, 1, Network(KB125, 25, flow_gbps=5), 1, 1, Binding.FLOW, 5000),
    ("flow, two ranks", 9600.0, 1, Network(KB125, 25, flow_gbps=5), 2, 1, Binding.CORES, 9600),
    ("DNN NIC of two nodes", 6400.0, 2, Network(KB125, 25, 2.5, 10), 2, 2, Binding.DNN_NIC, 5000),
    ("no NIC figure", 400.0, 1, Network(10**9), 1, 1, Binding.CORES, 400),
    ("goodput", 1600.0, 1, Network(KB125, 1, goodput=0.5), 1, 1, Binding.DATA_NIC, 500),
]


@pytest.mark.parametrize("case, rate, nodes, net, ranks, dnn_nodes, binding, items_s", CASES, ids=[c[0] for c in CASES])
def test_binding_resource_table(case, rate, nodes, net, ranks, dnn_nodes, binding, items_s):
    d = capacity.remote(Layout(ranks, 1.0, (rate,) * nodes, network=net, dnn_nodes=dnn_nodes))
    assert d.binding is binding and d.items_s == pytest.approx(items_s)
    assert min(d.limits.values()) == pytest.approx(items_s)
    assert capacity.items_to_gbps(d.items_s, KB125) == pytest.approx(min(d.limits.values()) * KB125 * 8 / 1e9)


def test_gpu_bound_and_costs():
    p = predict(Layout(2, 0.5, (10.0,)))
    assert p.binding is Binding.GPU and p.step_s == 0.5 and p.data_wait_fraction == 0.0
    assert capacity.usd_for(7.497, 1000 * 0.5) == pytest.approx(7.497 * 500 / 3600)


@pytest.mark.parametrize("layout, needle", [
    (Layout(0, 0.1), "ranks=0"), (Layout(1, 0.0), "compute_s=0.0"), (Layout(1, 0.1, (-1.0,)), "items/s=-1.0"),
    (Layout(1, 0.1, own=OwnCores(build_s=0.0)), "build_s=0.0"),
    (Layout(1, 0.1, network=Network(0.0)), "bytes_per_item=0.0"),
    (Layout(1, 0.1, network=Network(1.0, goodput=1.5)), "goodput=1.5"),
    (Layout(1, 0.1, network=Network(1.0, flow_gbps=math.nan)), "flow_gbps=nan"),
    (Layout(1, 0.1, network=Network(1.0, data_nic_gbps=-1)), "data_nic_gbps=-1 must be a positive number"),
    (Layout(1, 0.1, network=Network(1.0, dnn_nic_gbps=0)), "dnn_nic_gbps=0"), (Layout(True, 0.1), "ranks=True"),
])
def test_bad_figures_are_named(layout, needle):
    with pytest.raises(PlanError, match=needle.replace("(", r"\(")):
        predict(layout)


def test_the_planners_step_is_the_models():
    assert predict_step(0.1, 0.02, 2, trainer_s=0.02).step_s == \
        predict(Layout(1, 0.02, own=OwnCores(2.0, 0.1, 0.02, serves=True))).step_s


# -- plan against advice ---------------------------------------------------------------------------------------
gbps = st.one_of(st.none(), st.floats(0.5, 100.0))


@st.composite
def jobs(draw) -> dict:
    gpus = draw(st.integers(1, 8))
    job = {"gpus": gpus, "dnn_count": draw(st.integers(1, 3)), "vcpus": draw(st.integers(2, 96)),
           "own": draw(st.integers(0, 8 * gpus)), "data_nodes": draw(st.integers(1, 12)),
           "preprocess_s": draw(st.floats(0.005, 2.0)), "gpu_step_s": draw(st.floats(0.005, 1.0)),
           "batch_size": draw(st.integers(1, 512)), "efficiency": draw(st.floats(0.3, 1.0)),
           "bytes_per_sample": draw(st.one_of(st.none(), st.floats(1e3, 1e6))),
           "data_nic_gbps": draw(gbps), "dnn_nic_gbps": draw(gbps), "flow_gbps": draw(st.sampled_from([None, 5.0, 10.0])),
           "data_usd_h": draw(st.floats(0.05, 6.0)), "dnn_usd_h": draw(st.floats(0.5, 40.0)),
           "epoch_samples": draw(st.sampled_from([0, 50_000, 1_281_167]))}
    return job


def _plan_step(job: dict, nodes: int):
    """``hetero plan``'s prediction for the job fed by ``nodes`` data nodes."""
    return predict_network_step(job["preprocess_s"], job["gpu_step_s"], job["batch_size"], job["gpus"] * job["dnn_count"],
                                job["vcpus"], nodes, job["bytes_per_sample"], job["data_nic_gbps"], job["dnn_nic_gbps"],
                                job["dnn_count"], job["flow_gbps"], 0.0, job["efficiency"], job["own"], 1.0)


def _measured(job: dict, pred) -> LiveFigures:
    """What rank 0 measures over a window of the job in its steady state at ``pred``: every server delivers
    its share of what the ranks take (shares follow each server's capacity), its workers busy for that share
    of what its cores build."""
    ranks = job["gpus"] * job["dnn_count"]
    taken = ranks / pred.step_s
    node_cores = job["vcpus"] * job["efficiency"] / job["preprocess_s"]
    per_node = taken * pred.network_items_s / pred.items_s / job["data_nodes"]
    servers = [ServerFigures(f"d{i}:6000", per_node, per_node / node_cores, built_per_s=per_node)
               for i in range(job["data_nodes"])]
    if job["own"]:
        own_cores = job["own"] * job["efficiency"] / job["preprocess_s"]
        local = taken * pred.local_items_s / pred.items_s
        servers.append(ServerFigures("127.0.0.1:6000", local, local / own_cores, data_node=False, built_per_s=local))
    bytes_per_batch = None if job["bytes_per_sample"] is None else job["bytes_per_sample"] * job["batch_size"]
    steps = job["epoch_samples"] // (job["batch_size"] * ranks) or None
    return LiveFigures(pred.step_s, pred.step_s - job["gpu_step_s"], ranks, tuple(servers), steps, "data", "dnn",
                       job["dnn_count"], bytes_per_batch=bytes_per_batch, data_nic_gbps=job["data_nic_gbps"],
                       dnn_nic_gbps=job["dnn_nic_gbps"], flow_gbps=job["flow_gbps"], batch_size=job["batch_size"])


def _table(job: dict) -> PriceTable:
    rows = [InstancePrice("dnn", job["dnn_usd_h"], job["own"] + job["gpus"], job["gpus"], "test", "2026-11"),
            InstancePrice("data", job["data_usd_h"], job["vcpus"], 0, "test", "2026-11")]
    return PriceTable({r.instance_type: r for r in rows}, region="test", as_of="2026-11")


@settings(max_examples=EXAMPLES, deadline=None)
@given(jobs())
def test_plan_and_advice_agree_on_the_same_job(job):
    now = _plan_step(job, job["data_nodes"])
    figures = _measured(job, now)
    # what the advice reads must be readable: busy shares it does not floor, compute it does not floor
    assume(all(s.busy_fraction is None or s.busy_fraction >= 0.05 for s in figures.servers))
    assume(job["gpu_step_s"] >= 0.01 * now.step_s)
    table = _table(job)
    advice = advise(figures, {"data": job["data_usd_h"], "dnn": job["dnn_usd_h"]})
    assert advice.capacity_per_s == pytest.approx(now.items_s, rel=1e-9)
    assert advice.compute_s == pytest.approx(job["gpu_step_s"], rel=1e-9)
    assert advice.change is not None
    after = _plan_step(job, job["data_nodes"] + advice.change)
    assert advice.predicted_step_s == pytest.approx(after.step_s, rel=1e-9)
    assert advice.predicted_wait_fraction == pytest.approx(after.data_wait_fraction, rel=1e-9, abs=1e-12)
    if figures.steps_per_epoch:
        cluster = [("dnn", job["dnn_count"]), ("data", job["data_nodes"] + advice.change)]
        assert advice.predicted_job_usd_per_epoch == pytest.approx(
            table.cost_per_epoch(cluster, after.step_s, figures.steps_per_epoch), rel=1e-9)
        assert advice.job_usd_per_epoch == pytest.approx(table.cost_per_epoch(
            [("dnn", job["dnn_count"]), ("data", job["data_nodes"])], now.step_s, figures.steps_per_epoch), rel=1e-9)
