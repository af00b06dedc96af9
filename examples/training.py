"""One supervised training step, shared by the example jobs (``mnist``, ``imagefolder``)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def supervised_step(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                    optimizer: torch.optim.Optimizer, loss_fn: Callable[..., torch.Tensor]) -> float:
    """Forward, ``loss_fn(model(images), labels)``, backward, optimizer step. Returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(images), labels)
    loss.backward()
    optimizer.step()
    return float(loss.detach())
