"""Device-side finishing and the prefetch-to-device iterator (CPU here; CUDA tests marked gpu)."""
from __future__ import annotations

import pytest
import torch

from _fault_helpers import wait_until
from conftest import TOKEN
from data_service.errors import ConfigError
from data_service.pipeline import PipelineSpec
from dnn_worker import DeviceFeeder, FinishStage, LocalDataset, RemoteDataset
from dnn_worker.device import FinishError

OPTS = {"size": 40, "batch_size": 8, "shape": [1, 28, 28]}


def spec(finish_on):
    return PipelineSpec("examples.synthetic:build_finished_pipeline", {**OPTS, "finish_on": finish_on})


def test_device_finishing_equals_server_finishing_and_ships_a_quarter_of_the_bytes():
    from data_service.server import DataServer, ServerOptions

    dev = DataServer(spec("device"), TOKEN, ServerOptions(num_workers=1)).start()
    srv = DataServer(spec("server"), TOKEN, ServerOptions(num_workers=1)).start()
    try:
        ds = RemoteDataset([dev.address], TOKEN, seed=2)
        on_device = list(DeviceFeeder(ds, "cpu", finish=ds.finish_stage()))
        on_server = list(RemoteDataset([srv.address], TOKEN, seed=2))
        assert len(on_device) == len(on_server) == 5
        for a, b in zip(on_device, on_server):
            assert a["image"].dtype == torch.float32 and torch.equal(a["image"], b["image"])
        # the server counts a batch after its send returns, which can be after the consumer has it
        for server in (dev, srv):
            wait_until(lambda: server.stats.snapshot().batches_sent == 5, 10, "5 batches counted as sent")
        wire_dev, wire_srv = dev.stats.snapshot().raw_bytes, srv.stats.snapshot().raw_bytes
        # uint8 images + int64 labels vs float32 images + labels: ~4x fewer image bytes
        assert 3.5 < wire_srv / wire_dev <= 4.0
    finally:
        dev.shutdown(grace_s=1)
        srv.shutdown(grace_s=1)


def test_homogeneous_mode_finishes_the_same_way():
    ds = LocalDataset(spec("device"), seed=4)
    finished = list(DeviceFeeder(ds, "cpu", finish=ds.finish_stage()))
    reference = list(LocalDataset(spec("server"), seed=4))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(finished, reference))


@pytest.mark.parametrize("fn, match", [
    ("examples.synthetic:bad_finish_shape", r"'image' from shape \[8, 1, 28, 28\] to \[8, 784\]"),
    ("examples.synthetic:bad_finish_dtype", r"'image' into torch.float64, expected torch.float32"),
])
def test_unexpected_finish_changes_name_the_tensor(fn, match):
    stage = FinishStage.load(fn, {"image": "float32"})
    batch = next(iter(LocalDataset(PipelineSpec("examples.synthetic:build_pipeline", OPTS))))
    with pytest.raises(FinishError, match=match):
        stage(batch)


def test_undeclared_dtype_change_is_an_error():
    stage = FinishStage.load("examples.synthetic:normalize", {})
    batch = next(iter(LocalDataset(PipelineSpec("examples.synthetic:build_pipeline", OPTS))))
    with pytest.raises(FinishError, match="declare it in Pipeline"):
        stage(batch)


def test_bad_feeder_options():
    with pytest.raises(ConfigError, match="depth=0"):
        DeviceFeeder([], "cpu", depth=0)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            DeviceFeeder([], "cuda")
    with pytest.raises(ConfigError, match="unknown dtypes"):
        FinishStage.load("examples.synthetic:normalize", {"image": "float128"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetch_matches_cpu_finish_within_tolerance():
    ds = LocalDataset(spec("device"), seed=4)
    gpu = [b["image"].cpu() for b in DeviceFeeder(ds, "cuda", finish=ds.finish_stage(), depth=3)]
    cpu = [b["image"] for b in LocalDataset(spec("server"), seed=4)]
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
