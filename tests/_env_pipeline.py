"""A pipeline whose every sample is an environment variable's value as the worker reads it."""
from __future__ import annotations

import os

import torch

from data_service import Pipeline

VAR = "HETERO_TEST_ENV_MARK"


class _Marks:
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return {"mark": torch.tensor(int(os.environ.get(VAR, "0")), dtype=torch.int64)}


def build_pipeline(batch_size: int = 4) -> Pipeline:
    return Pipeline(dataset=_Marks(), batch_size=batch_size, shuffle=False)
