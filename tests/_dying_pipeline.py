"""A pipeline whose worker, on sample ``die_at``, closes its pipe to the server and is killed by
SIGKILL a moment later (once: a marker file): the server hears of the death before the process
has ended, so its exit status is not known yet."""
from __future__ import annotations

import os
import signal
import time

import torch

from data_service import Pipeline


class _Dying:
    def __init__(self, die_at: int, marker: str) -> None:
        self.die_at, self.marker = die_at, marker

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        if i == self.die_at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.closerange(3, 1 << 16)  # the pipe to the server among them
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        return {"x": torch.tensor(i, dtype=torch.int64)}


def build_pipeline(die_at: int, marker: str, batch_size: int = 4) -> Pipeline:
    return Pipeline(dataset=_Dying(die_at, marker), batch_size=batch_size, shuffle=False)
