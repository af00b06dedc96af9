"""A map-style data set for ``hetero prepare pkg.mod:fn``: uint8 tensors and JPEG bytes, labelled."""
from __future__ import annotations

import io

import torch
from PIL import Image


class Mixed:
    classes = ["even", "odd"]

    def __init__(self, n: int = 6) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        pixels = torch.full((3, 8 + i, 10), 20 * i, dtype=torch.uint8)
        if i % 2:  # encoded bytes, carried as they are
            buf = io.BytesIO()
            Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(buf, format="JPEG", quality=95)
            return buf.getvalue(), 1
        return pixels, 0  # a tensor: written as a PNG, so it decodes back exactly


def make(n: int = 6) -> Mixed:
    return Mixed(n)
