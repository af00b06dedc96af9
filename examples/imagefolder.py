"""An image-folder training job: the image pipeline, torchvision's ResNet-18, its step and evaluation.

The pipeline is the product's (:mod:`data_service.pipelines.images`, re-exported here, so
``--hp pipeline=examples.imagefolder:build_pipeline`` is the same pipeline); the model side is user
code the trainer reaches by import path, as it reaches any user's:

* ``examples.imagefolder:resnet18``: torchvision's ResNet-18, no pretrained weights;
* ``examples.imagefolder:train_step``: one cross-entropy step;
* ``examples.imagefolder:evaluate``: top-1 accuracy on the ``validation`` channel (the
  evaluation of ``resnet18`` unless another is named: ``evaluate=auto`` takes the model's
  module's own); no ``validation`` channel, no test accuracy.

    hetero local --data DIR --hp pipeline=data_service.pipelines.images:build_pipeline \\
      --hp model=examples.imagefolder:resnet18 --hp step=examples.imagefolder:train_step
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from data_service.errors import ConfigError
from data_service.pipelines.images import *  # noqa: F401,F403  (the pipeline under this import path)
from data_service.pipelines.images import count_classes, decode, finish, scan

from .training import supervised_step


def resnet18(num_classes: int = 0, data_dir: str | None = None, shards: str = "") -> nn.Module:
    """torchvision's ResNet-18, randomly initialised (no pretrained weights, no download).

    Args:
        num_classes: outputs; 0 = the number of classes of ``shards``, else of the class folders of
            ``data_dir`` / ``SM_CHANNEL_TRAINING`` (pass it explicitly on nodes that do not see the data).
    """
    from torchvision.models import resnet18 as tv_resnet18

    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
        raise ConfigError(f"num_classes={num_classes!r} must be an integer >= 1 (0 = count the class folders)")
    if num_classes == 0:
        try:
            num_classes = count_classes(data_dir, shards)
        except ConfigError as exc:
            raise ConfigError(f"resnet18: cannot count classes ({exc}); pass model.num_classes=N") from None
    return tv_resnet18(weights=None, num_classes=num_classes)


def device_batch(batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised float images, labels) on ``device`` from a finished batch or a raw uint8 one."""
    images, labels = (batch["image"], batch["label"]) if isinstance(batch, dict) else batch
    images = images.to(device, non_blocking=True)
    if images.dtype == torch.uint8:
        images = finish({"image": images})["image"]
    return images, labels.to(device, non_blocking=True)


def train_step(model: nn.Module, batch, optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """One step: forward, cross-entropy, backward, optimizer step. Returns the loss."""
    return supervised_step(model, *device_batch(batch, device), optimizer, F.cross_entropy)


@torch.no_grad()
def evaluate(model: nn.Module, device: torch.device, batch_size: int = 64, image_size: int = 224,
             limit: int = 0) -> float | None:
    """Top-1 accuracy on ``SM_CHANNEL_VALIDATION`` (same layout; centre crop); None when absent
    (a job reading shards with no ``validation`` channel has no test accuracy). ``limit``: only
    the first ``limit`` images (0 = all; the launcher tries the evaluation on 2 before training)."""
    from torchvision.transforms import v2

    root = os.environ.get("SM_CHANNEL_VALIDATION", "")
    if not root or not os.path.isdir(root):
        return None
    _, samples = scan(root)
    samples = samples[:limit] if limit > 0 else samples
    resize = v2.Compose([v2.Resize(image_size, antialias=True), v2.CenterCrop(image_size)])
    model.eval()
    correct = 0
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        batch = {"image": torch.stack([resize(decode(p)) for p, _ in chunk]),
                 "label": torch.tensor([y for _, y in chunk], dtype=torch.int64)}
        images, labels = device_batch(batch, device)
        correct += int((model(images).argmax(1) == labels).sum())
    model.train()
    return correct / len(samples)
