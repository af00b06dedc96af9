"""A map-style data set for ``hetero prepare pkg.mod:fn``: noise JPEGs of about 60 KB, labelled, deterministic.

``HETERO_TEST_FAIL_AT=i`` makes item ``i`` raise, as a machine that stops mid-way would.
"""
from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image


class Noise:
    classes = ["a", "b", "c"]

    def __init__(self, n: int = 30, side: int = 160) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if str(i) == os.environ.get("HETERO_TEST_FAIL_AT"):
            raise RuntimeError(f"item {i}: the machine stops here")
        pixels = np.random.default_rng(i).integers(0, 256, (self.side, self.side, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        return buf.getvalue(), i % 3


def make(n: int = 30, side: int = 160) -> Noise:
    return Noise(n, side)
