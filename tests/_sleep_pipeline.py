"""A pipeline whose batches take wall time but no CPU (a sleep per sample): data nodes of it
scale with their number on any machine, as CPU nodes of their own would."""
from __future__ import annotations

import time

import torch

from data_service import Pipeline


class Tiny:
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        return {"x": torch.full((4,), i % 251, dtype=torch.uint8), "label": torch.tensor(i % 10)}


class Sleep:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, sample):
        time.sleep(self.ms / 1000.0)
        return sample


def build(size: int = 800, batch_size: int = 8, sample_ms: float = 5.0) -> Pipeline:
    """``size`` samples, ``batch_size`` per batch, each sample sleeping ``sample_ms``."""
    return Pipeline(dataset=Tiny(size), batch_size=batch_size, transform=Sleep(sample_ms), drop_last=True)
