"""examples.mnist and hetero.synthetic.mnist: IDX files (raw and .gz), synthetic digits, the pipeline, the CNN step, `hetero synth`."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec, build_batch
from examples import mnist
from hetero.synthetic import mnist as synthetic_mnist

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["x-idx3-ubyte", "x-idx3-ubyte.gz"])
def test_idx_roundtrip(tmp_path, name):
    array = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    synthetic_mnist.write_idx(tmp_path / name, array)
    assert np.array_equal(mnist.read_idx(tmp_path / name), array)


def test_bad_idx_files_are_named(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ConfigError, match="not a uint8 IDX file"):
        mnist.read_idx(tmp_path / "bad")
    synthetic_mnist.write_idx(tmp_path / "short", np.zeros((3, 4), dtype=np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-1])
    with pytest.raises(ConfigError, match="body has 11"):
        mnist.read_idx(tmp_path / "short")


def test_missing_data_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("SM_CHANNEL_TRAINING", raising=False)
    with pytest.raises(ConfigError, match="SM_CHANNEL_TRAINING is unset"):
        mnist.build_pipeline()
    with pytest.raises(ConfigError, match="no train-images-idx3-ubyte"):
        mnist.build_pipeline(data_dir=str(tmp_path))


def test_synthetic_digits_are_deterministic_and_class_dependent():
    a, la = synthetic_mnist.synthetic_digits(200, seed=1)
    b, lb = synthetic_mnist.synthetic_digits(200, seed=1)
    assert a.shape == (200, 28, 28) and a.dtype == np.uint8 and np.array_equal(a, b) and np.array_equal(la, lb)
    means = [a[la == d].astype(float).mean() for d in (1, 8)]
    assert means[1] > means[0] * 1.5  # an 8 lights every segment, a 1 two of them


def test_pipeline_batches_are_reproducible(tmp_path, monkeypatch):
    synthetic_mnist.write_synthetic(tmp_path, train=64, test=0, gz=True)
    monkeypatch.setenv("SM_CHANNEL_TRAINING", str(tmp_path))
    pipe = PipelineSpec("examples.mnist:build_pipeline", {"batch_size": 16, "augment_repeats": 2}).load()
    cfg = pipe.epoch_shape()
    batch = build_batch(pipe, cfg, seed=5, epoch=1, index=2)
    images, labels = batch["image"], batch["label"]
    assert images.shape == (16, 1, 28, 28) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    again = build_batch(pipe, cfg, seed=5, epoch=1, index=2)["image"]
    other = build_batch(pipe, cfg, seed=6, epoch=1, index=2)["image"]
    assert torch.equal(images, again) and not torch.equal(images, other)
    with pytest.raises(ConfigError, match="blur_kernel=4 must be an odd number"):
        mnist.build_pipeline(blur_kernel=4)


def test_train_step_lowers_the_loss_and_evaluate_reads_t10k(tmp_path, monkeypatch):
    synthetic_mnist.write_synthetic(tmp_path, train=256, test=200)
    monkeypatch.setenv("SM_CHANNEL_TRAINING", str(tmp_path))
    torch.manual_seed(0)
    pipe = mnist.build_pipeline(batch_size=64, blur_kernel=0, affine=False)
    batch = pipe.collate_fn([pipe.dataset[i] for i in range(64)])
    model = mnist.Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    losses = [mnist.train_step(model, batch, opt, torch.device("cpu")) for _ in range(8)]
    assert losses[-1] < losses[0]
    accuracy = mnist.evaluate(model, torch.device("cpu"))
    assert 0.0 <= accuracy <= 1.0
    monkeypatch.setenv("SM_CHANNEL_TRAINING", str(tmp_path / "none"))
    assert mnist.evaluate(model, torch.device("cpu")) is None


def test_hetero_synth_writes_mnist_files(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM_")}
    proc = subprocess.run([sys.executable, "-m", "hetero", "synth", str(tmp_path), "--train", "30", "--test", "10",
                           "--gzip"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert mnist.find_split(tmp_path, "train") is not None
    assert len(mnist.MnistDataset(str(tmp_path), "t10k")) == 10


# -- device-side finishing
def test_uint8_on_the_wire_and_finished_on_the_device_matches_the_server_path(tmp_path, monkeypatch):
    from dnn_worker import DeviceFeeder, FinishStage

    synthetic_mnist.write_synthetic(tmp_path, train=64, test=0)
    monkeypatch.setenv("SM_CHANNEL_TRAINING", str(tmp_path))
    device_pipe = PipelineSpec("examples.mnist:build_pipeline", {"batch_size": 16}).load()
    server_pipe = PipelineSpec("examples.mnist:build_pipeline", {"batch_size": 16, "finish_on": "server"}).load()
    assert device_pipe.finish_target() == "examples.mnist:finish" and device_pipe.finish_dtypes == {"image": "float32"}
    assert server_pipe.finish_target() == ""
    cfg = device_pipe.epoch_shape()
    raw = build_batch(device_pipe, cfg, seed=1, epoch=0, index=1)
    served = build_batch(server_pipe, server_pipe.epoch_shape(), seed=1, epoch=0, index=1)
    assert raw["image"].dtype == torch.uint8 and served["image"].dtype == torch.float32
    stage = FinishStage.load(device_pipe.finish_target(), device_pipe.finish_dtypes)
    [finished] = list(DeviceFeeder([raw], "cpu", finish=stage))
    assert finished["image"].dtype == torch.float32 and torch.equal(finished["label"], served["label"])
    assert torch.allclose(finished["image"], served["image"], atol=1e-6)  # same augmentation, same numbers
    assert abs(float(finished["image"].mean()) - float((raw["image"].float() / 255 - 0.1307).mean() / 0.3081)) < 1e-4
    with pytest.raises(ConfigError, match="finish_on='gpu' must be 'device'"):
        mnist.build_pipeline(data_dir=str(tmp_path), finish_on="gpu")


def test_wire_bytes_per_sample_float32_path_is_four_times_the_uint8_path(tmp_path):
    synthetic_mnist.write_synthetic(tmp_path, train=128, test=0)
    r = mnist.wire_bytes_per_sample(tmp_path, batch_size=32, batches=2)
    assert r["device"] == 28 * 28 + 8          # uint8 pixels + an int64 label
    assert r["server"] == 28 * 28 * 4 + 8      # float32 pixels + the label
    assert 3.9 < r["ratio"] < 4.0


@pytest.mark.slow
def test_wire_bytes_command_measures_through_a_data_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM_")}
    proc = subprocess.run([sys.executable, "-m", "examples.mnist", "--wire-bytes", "--batch-size", "32"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ratio: 3.9" in proc.stdout and "served" in proc.stdout, proc.stdout
