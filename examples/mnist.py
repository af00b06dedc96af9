"""The MNIST training job: IDX files, a CPU-heavy augmentation, the PyTorch example CNN.

Plug-in points used by the launcher (each can be replaced by import path):

* ``examples.mnist:build_pipeline``: the data pipeline (runs on data servers, or in-process);
* ``examples.mnist:Net``: the model; ``examples.mnist:train_step``: one optimisation step;
* ``examples.mnist:evaluate``: test accuracy on the t10k files, when present.

Batches are ``{"image": uint8 [B, 1, 28, 28], "label": int64 [B]}`` on the wire (1 byte per
pixel); :func:`finish`, the pipeline's device-side last stage, turns the images into
normalised float32 on the training device (``DeviceFeeder``). ``finish_on="server"`` keeps
the older path, float32 images normalised on the data server (4x the bytes), for comparison;
``python -m examples.mnist --wire-bytes`` prints both figures.

Data comes from ``SM_CHANNEL_TRAINING`` (or ``data_dir``): ``train-images-idx3-ubyte``,
``train-labels-idx1-ubyte`` and optionally the ``t10k-*`` pair, raw or ``.gz``.
``hetero synth`` (:func:`hetero.synthetic.mnist.write_synthetic`) writes MNIST-format files of drawn
digits for offline use.
"""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from data_service import Pipeline
from data_service.errors import ConfigError

from .training import supervised_step

MEAN, STD = 0.1307, 0.3081
_DTYPES = {0x08: np.uint8}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (raw or gzip) as a numpy array."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
        raise ConfigError(f"{path} is not a uint8 IDX file (magic bytes {data[:4].hex()})")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ConfigError(f"{path}: header says {dims} ({int(np.prod(dims))} bytes), body has {body.size}")
    return body.reshape(dims)


def find_split(data_dir: str | os.PathLike, split: str) -> tuple[Path, Path] | None:
    """(images, labels) paths of ``split`` ("train" or "t10k"), raw or .gz; None when absent."""
    found = []
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        for name in (f"{split}-{kind}", f"{split}-{kind}.gz"):
            if (Path(data_dir) / name).is_file():
                found.append(Path(data_dir) / name)
                break
    return (found[0], found[1]) if len(found) == 2 else None


def default_data_dir(data_dir: str | None = None) -> str:
    path = data_dir or os.environ.get("SM_CHANNEL_TRAINING", "")
    if not path:
        raise ConfigError("no MNIST data: SM_CHANNEL_TRAINING is unset and data_dir was not given; "
                          "pass a 'training' channel (or run `hetero synth DIR` and set data_dir)")
    return path


class MnistDataset:
    """Map-style: sample i is (uint8 image [1, 28, 28], int label)."""

    def __init__(self, data_dir: str, split: str = "train", limit: int = 0) -> None:
        paths = find_split(data_dir, split)
        if paths is None:
            present = sorted(os.listdir(data_dir)) if os.path.isdir(data_dir) else "no such directory"
            raise ConfigError(f"no {split}-images-idx3-ubyte[.gz] / {split}-labels-idx1-ubyte[.gz] in "
                              f"{data_dir} (found: {present})")
        images, labels = read_idx(paths[0]), read_idx(paths[1])
        if len(images) != len(labels):
            raise ConfigError(f"{paths[0]} has {len(images)} images but {paths[1]} has {len(labels)} labels")
        if limit:
            images, labels = images[:limit], labels[:limit]
        self.images = torch.from_numpy(images.copy()).unsqueeze(1)
        self.labels = torch.from_numpy(labels.astype(np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], int(self.labels[i])


class Augment:
    """Random affine + ``repeats`` x GaussianBlur(``kernel``): CPU-heavy, cost set by options.

    Works on uint8 image tensors and returns uint8 (torchvision v2's affine and blur kernels
    accept uint8; the blur computes in float inside and rounds back), so batches stay compact.
    """

    def __init__(self, kernel: int, repeats: int, affine: bool) -> None:
        from torchvision.transforms import v2

        if kernel and (kernel < 3 or kernel % 2 == 0):
            raise ConfigError(f"blur_kernel={kernel} must be an odd number >= 3 (or 0 for no blur)")
        steps = [v2.RandomAffine(degrees=10, translate=(0.1, 0.1))] if affine else []
        if kernel:
            steps += [v2.GaussianBlur(kernel, sigma=(0.1, 1.0))] * repeats
        self.transform = v2.Compose(steps) if steps else None

    def __call__(self, sample):
        image, label = sample
        if self.transform is not None:
            image = self.transform(image)
            if image.dtype != torch.uint8:  # a float-only transform: back to the compact dtype
                image = image.round().clamp_(0, 255).to(torch.uint8)
        return image, label


FINISH_DTYPES = {"image": "float32"}


def collate(samples) -> dict:
    """``{"image": uint8 [B, 1, 28, 28], "label": int64 [B]}``: what travels with ``finish_on="device"``."""
    return {"image": torch.stack([s[0] for s in samples]),
            "label": torch.tensor([s[1] for s in samples], dtype=torch.int64)}


def finish(batch: dict) -> dict:
    """The device-side last stage: uint8 images -> float32 in [0, 1] -> MNIST-normalised
    (mean 0.1307, std 0.3081); labels unchanged. Runs wherever the batch is (the GPU)."""
    out = dict(batch)
    out["image"] = batch["image"].to(torch.float32).div_(255.0).sub_(MEAN).div_(STD)
    return out


def collate_finished_on_server(samples) -> dict:
    """``finish_on="server"``: the same batch, finished on the data server (float32 on the wire)."""
    return finish(collate(samples))


def build_pipeline(batch_size: int = 64, blur_kernel: int = 11, augment_repeats: int = 1, affine: bool = True,
                   limit: int = 0, data_dir: str | None = None, drop_last: bool = True,
                   finish_on: str = "device") -> Pipeline:
    """MNIST batches ``{"image": [B, 1, 28, 28], "label": int64 [B]}``.

    Args:
        batch_size: images per batch. blur_kernel: GaussianBlur kernel (odd; 0 = none).
        augment_repeats: blur passes per image (the CPU cost knob). affine: random affine first.
        limit: use only the first ``limit`` images (0 = all).
        data_dir: IDX folder; default ``SM_CHANNEL_TRAINING`` (keep it out of the options when
            data nodes see the data at different paths: options must match on every server).
        finish_on: ``"device"`` (default): uint8 images on the wire, normalised on the training
            device by :func:`finish`; ``"server"``: normalised float32 images on the wire.
    """
    if batch_size < 1 or augment_repeats < 0:
        raise ConfigError(f"batch_size={batch_size} must be >= 1 and augment_repeats={augment_repeats} >= 0")
    if finish_on not in ("device", "server"):
        raise ConfigError(f"finish_on={finish_on!r} must be 'device' (uint8 on the wire, normalised on the "
                          "training device) or 'server' (float32 on the wire)")
    dataset = MnistDataset(default_data_dir(data_dir), "train", limit)
    augment = Augment(blur_kernel, augment_repeats, affine)
    if finish_on == "server":
        return Pipeline(dataset=dataset, batch_size=batch_size, transform=augment,
                        collate_fn=collate_finished_on_server, drop_last=drop_last, shuffle=True)
    return Pipeline(dataset=dataset, batch_size=batch_size, transform=augment, collate_fn=collate,
                    drop_last=drop_last, shuffle=True, finish=finish, finish_dtypes=FINISH_DTYPES)


# What a worker imports while it builds the pipeline (Augment): a data node's warm parent imports
# it once, before forking its workers, so they share it (optional: what the first worker imports
# is shared with the others anyway; declaring it saves that worker its private copy).
build_pipeline.worker_imports = ("torchvision.transforms.v2",)


def prepare(batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised float images, labels) on ``device``, from a finished batch (the trainer's
    ``DeviceFeeder`` already ran :func:`finish`) or a raw uint8 one (finished here).
    Accepts the dict batches of this pipeline or ``(images, labels)`` tuples."""
    if isinstance(batch, dict):
        images, labels = batch["image"], batch["label"]
    else:
        images, labels = batch
    images = images.to(device, non_blocking=True)
    if images.dtype == torch.uint8:
        images = finish({"image": images})["image"]
    return images, labels.to(device, non_blocking=True)


class Net(nn.Module):
    """The CNN of the PyTorch MNIST example (two convs, dropout, two linear layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train_step(model: nn.Module, batch, optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """One step: forward, NLL loss, backward, optimizer step. Returns the loss."""
    return supervised_step(model, *prepare(batch, device), optimizer, F.nll_loss)


@torch.no_grad()
def evaluate(model: nn.Module, device: torch.device, batch_size: int = 1000, limit: int = 0) -> float | None:
    """Accuracy on the t10k files of ``SM_CHANNEL_TRAINING``; None when they are absent.
    ``limit``: only the first ``limit`` images (0 = all)."""
    data_dir = os.environ.get("SM_CHANNEL_TRAINING", "")
    if not data_dir or find_split(data_dir, "t10k") is None:
        return None
    test = MnistDataset(data_dir, "t10k", limit)
    model.eval()
    correct = 0
    for start in range(0, len(test), batch_size):
        batch = {"image": test.images[start:start + batch_size], "label": test.labels[start:start + batch_size]}
        images, labels = prepare(batch, device)
        correct += int((model(images).argmax(1) == labels).sum())
    model.train()
    return correct / max(1, len(test))


def wire_bytes_per_sample(data_dir: str | os.PathLike, batch_size: int = 64, batches: int = 4,
                          serve: bool = False) -> dict[str, float]:
    """Bytes per sample on the wire for ``finish_on="server"`` (float32) and ``"device"`` (uint8).

    Args:
        data_dir: MNIST IDX folder. batch_size: images per batch. batches: batches measured.
        serve: also measure through a real data server over TCP (its ``bytes_sent`` counter:
            payload plus per-batch header); otherwise only the encoded payload is counted.

    Returns:
        ``{"server": ..., "device": ..., "ratio": server / device}`` from the payload, and with
        ``serve`` the same keys prefixed ``served_``.
    """
    from data_service.contract.tensor_layout import plan_layout
    from data_service.contract.pipeline import PipelineSpec, build_batch

    out: dict[str, float] = {}
    for finish_on in ("server", "device"):
        options = {"batch_size": batch_size, "data_dir": str(data_dir), "finish_on": finish_on}
        pipe = PipelineSpec("examples.mnist:build_pipeline", options).load()
        cfg = pipe.epoch_shape()
        if cfg.num_batches < batches:
            raise ConfigError(f"{data_dir} holds {cfg.num_batches} batches of {batch_size}; need {batches}")
        total = sum(plan_layout(build_batch(pipe, cfg, 0, 0, i))[3] for i in range(batches))
        out[finish_on] = total / (batches * batch_size)
        if serve:
            out[f"served_{finish_on}"] = _served_bytes(options, batches) / (batches * batch_size)
    out["ratio"] = out["server"] / out["device"]
    if serve:
        out["served_ratio"] = out["served_server"] / out["served_device"]
    return out


def _served_bytes(options: dict, batches: int) -> int:
    """Serve ``batches`` batches over loopback TCP; the server's ``bytes_sent``."""
    import itertools
    import secrets

    from torch.utils.data import DataLoader

    from data_service.contract.pipeline import PipelineSpec
    from data_service.server import DataServer, ServerOptions
    from dnn_worker import RemoteDataset

    token = secrets.token_hex(16)
    server = DataServer(PipelineSpec("examples.mnist:build_pipeline", options), token,
                        ServerOptions(num_workers=1)).start()
    try:
        ds = RemoteDataset([server.address], token, shared_memory=False, connect_timeout=60.0)
        for _ in itertools.islice(DataLoader(ds, batch_size=None, num_workers=0), batches):
            pass
        return server.stats.snapshot().bytes_sent
    finally:
        server.shutdown(grace_s=5.0, reason="wire-bytes measurement done")


def main(argv: list[str] | None = None) -> int:
    """``python -m examples.mnist --wire-bytes [--data DIR] [--batch-size 64] [--no-serve]``."""
    import argparse
    import tempfile

    from hetero.synthetic.mnist import write_synthetic

    p = argparse.ArgumentParser(prog="python -m examples.mnist", description=main.__doc__)
    p.add_argument("--wire-bytes", action="store_true", required=True,
                   help="print bytes per sample on the wire: float32 (finish_on=server) vs uint8 + device finishing")
    p.add_argument("--data", default=None, help="MNIST IDX folder (default: synthetic digits in a temp folder)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--no-serve", action="store_true", help="count encoded payloads only; start no data server")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mnist-wire-") as tmp:
        data = args.data
        if data is None:
            write_synthetic(tmp, train=args.batch_size * args.batches, test=0)
            data = tmp
        try:
            r = wire_bytes_per_sample(data, args.batch_size, args.batches, serve=not args.no_serve)
        except ConfigError as exc:
            print(f"examples.mnist: {exc}")
            return 2
    print(f"bytes per sample on the wire (batch {args.batch_size}, {args.batches} batches):")
    print(f"  float32, finished on the server (finish_on=server): {r['server']:.1f} payload"
          + (f", {r['served_server']:.1f} served" if "served_server" in r else ""))
    print(f"  uint8, finished on the device   (finish_on=device): {r['device']:.1f} payload"
          + (f", {r['served_device']:.1f} served" if "served_device" in r else ""))
    print(f"  ratio: {r['ratio']:.2f}x payload" + (f", {r['served_ratio']:.2f}x served" if "served_ratio" in r else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
