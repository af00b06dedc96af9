"""A video classification job: the video pipeline, a 3D CNN, its step and evaluation.

The pipeline is the product's (:mod:`data_service.pipelines.video`); the model side is user code the
trainer reaches by import path:

* ``examples.video:r3d_18``: torchvision's R3D-18 (no pretrained weights), what Kinetics baselines train;
* ``examples.video:small3d``: a four-layer 3D CNN that trains on CPU in a test or the quickstart;
* ``examples.video:train_step``: one cross-entropy step;
* ``examples.video:evaluate``: top-1 accuracy on centre clips of the ``validation`` channel's videos
  (the evaluation of both models; none without a ``validation`` channel).

    hetero local --data DIR --hp pipeline=data_service.pipelines.video:build_pipeline \\
      --hp model=examples.video:small3d --hp step=examples.video:train_step
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from data_service.errors import ConfigError
from data_service.pipelines.sources import data_root, scan
from data_service.pipelines.video import VIDEO_EXTENSIONS, finish

from .training import supervised_step


def _classes(num_classes: int, data_dir: str | None, model: str) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
        raise ConfigError(f"num_classes={num_classes!r} must be an integer >= 1 (0 = count the class folders)")
    if num_classes:
        return num_classes
    try:
        return len(scan(data_root(data_dir), VIDEO_EXTENSIONS, "video")[0])
    except ConfigError as exc:
        raise ConfigError(f"{model}: cannot count classes ({exc}); pass model.num_classes=N") from None


def r3d_18(num_classes: int = 0, data_dir: str | None = None) -> nn.Module:
    """torchvision's R3D-18 for ``[B, 3, T, H, W]`` clips, randomly initialised (no download).

    Args:
        num_classes: outputs; 0 = the class folders of ``data_dir`` / ``SM_CHANNEL_TRAINING``.
    """
    from torchvision.models.video import r3d_18 as tv_r3d_18

    return tv_r3d_18(weights=None, num_classes=_classes(num_classes, data_dir, "r3d_18"))


def small3d(num_classes: int = 0, data_dir: str | None = None, width: int = 16) -> nn.Module:
    """Four 3D convolutions (``width`` to 8 x ``width`` channels), global pooling, a linear layer."""
    n = _classes(num_classes, data_dir, "small3d")
    layers: list[nn.Module] = []
    channels = 3
    for k in range(4):
        out = width * 2 ** k
        layers += [nn.Conv3d(channels, out, 3, stride=(1, 2, 2) if k == 0 else 2, padding=1),
                   nn.BatchNorm3d(out), nn.ReLU(inplace=True)]
        channels = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(channels, n))


def device_batch(batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised float clips ``[B, 3, T, H, W]``, labels) on ``device`` from a finished or raw batch."""
    videos, labels = batch["video"].to(device, non_blocking=True), batch["label"].to(device, non_blocking=True)
    if videos.dtype == torch.uint8:
        videos = finish({"video": videos})["video"]
    return videos, labels


def train_step(model: nn.Module, batch, optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """One step: forward, cross-entropy, backward, optimizer step. Returns the loss."""
    return supervised_step(model, *device_batch(batch, device), optimizer, F.cross_entropy)


@torch.no_grad()
def evaluate(model: nn.Module, device: torch.device, batch_size: int = 8, image_size: int = 112,
             frames_per_clip: int = 8, frame_stride: int = 2, limit: int = 0) -> float | None:
    """Top-1 accuracy on one centre clip of each video in ``SM_CHANNEL_VALIDATION``; None when absent.
    ``limit``: only the first ``limit`` videos (0 = all; the launcher tries the evaluation on 2 before
    training)."""
    from data_service.contract.pipeline import build_batch
    from data_service.pipelines.video import build_pipeline

    root = os.environ.get("SM_CHANNEL_VALIDATION", "")
    if not root or not os.path.isdir(root):
        return None
    pipe = build_pipeline(data_dir=root, batch_size=batch_size, image_size=image_size, crop="center", flip=False,
                          frames_per_clip=frames_per_clip, frame_stride=frame_stride, limit=limit, drop_last=False)
    shape = pipe.epoch_shape()
    model.eval()
    correct = total = 0
    for index in range(shape.num_batches):
        videos, labels = device_batch(build_batch(pipe, shape, seed=0, epoch=0, index=index), device)
        correct += int((model(videos).argmax(1) == labels).sum())
        total += len(labels)
    model.train()
    return correct / total if total else None
