"""A small JPEG image folder of drawn shapes, for tests and the quickstart (no download).

``write_image_folder(root)`` writes ``root/<shape>/<n>.jpg``: one class per shape (circle,
square, triangle, cross, ring, stripes), each image a different size (300-500 px a side), a
shaded background, the shape in a random colour, place and size, plus noise. The class is
visible in every crop of reasonable size, so a small CNN learns it in a few hundred steps.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from data_service.errors import ConfigError

SHAPES = ("circle", "square", "triangle", "cross", "ring", "stripes")


def _mask(shape: str, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Boolean [h, w] mask of one ``shape`` at a random place and size."""
    r = rng.uniform(0.25, 0.4) * min(h, w)
    cy, cx = rng.uniform(r, h - r), rng.uniform(r, w - r)
    y, x = np.ogrid[:h, :w]
    dy, dx = y - cy, x - cx
    if shape == "circle":
        return dy ** 2 + dx ** 2 <= r ** 2
    if shape == "square":
        return (np.abs(dy) <= r * 0.85) & (np.abs(dx) <= r * 0.85)
    if shape == "triangle":
        return (dy <= r * 0.7) & (dy >= -r + 2 * np.abs(dx) * 0.9)
    if shape == "cross":
        bar = r * 0.3
        return ((np.abs(dy) <= bar) & (np.abs(dx) <= r)) | ((np.abs(dx) <= bar) & (np.abs(dy) <= r))
    if shape == "ring":
        d2 = dy ** 2 + dx ** 2
        return (d2 <= r ** 2) & (d2 >= (r * 0.6) ** 2)
    if shape == "stripes":
        period = max(8.0, r / 3)
        return (np.abs(dy) <= r) & (np.abs(dx) <= r) & (((dx + r) // period) % 2 == 0)
    raise ConfigError(f"shape {shape!r} is not one of {SHAPES}")


def draw(shape: str, rng: np.random.Generator, min_side: int = 300, max_side: int = 500) -> torch.Tensor:
    """One uint8 ``[3, H, W]`` image of ``shape`` (H, W drawn from ``min_side..max_side``)."""
    h, w = (int(v) for v in rng.integers(min_side, max_side + 1, 2))
    low, high = rng.uniform(0, 120, 3), rng.uniform(100, 255, 3)
    ramp = np.linspace(0, 1, w, dtype=np.float32)[None, :] if rng.random() < 0.5 else \
        np.linspace(0, 1, h, dtype=np.float32)[:, None]
    image = low[:, None, None] + (high - low)[:, None, None] * ramp[None]
    image = np.broadcast_to(image, (3, h, w)).astype(np.float32)
    colour = rng.uniform(0, 255, 3).astype(np.float32)
    colour = np.where(np.abs(colour - image.mean(axis=(1, 2))) < 60, 255 - colour, colour)
    mask = _mask(shape, h, w, rng)
    image = np.where(mask[None], colour[:, None, None], image)
    image = image + rng.integers(-20, 21, image.shape, dtype=np.int16)  # texture, so decoding is not trivial
    return torch.from_numpy(np.clip(image, 0, 255).astype(np.uint8))


def _write_one(job: tuple) -> None:
    from torchvision.io import encode_jpeg

    path, shape, seed, label, n, min_side, max_side, quality = job
    rng = np.random.default_rng([seed, label, n])  # per image: the same files whatever the process count
    Path(path).write_bytes(encode_jpeg(draw(shape, rng, min_side, max_side), quality=quality).numpy().tobytes())


def write_image_folder(root: str | os.PathLike, per_class: int = 32, classes: int = 4, seed: int = 0,
                       min_side: int = 300, max_side: int = 500, quality: int = 90, threads: int = 1) -> list[Path]:
    """Write ``classes`` x ``per_class`` JPEGs as ``root/<shape>/<n>.jpg``; returns the paths.

    ``threads`` > 1 draws and encodes in that many threads (same files).

    Raises:
        ConfigError: a count or size out of range (naming it and the range).
    """
    if not 1 <= classes <= len(SHAPES):
        raise ConfigError(f"classes={classes} must be in 1..{len(SHAPES)} (one per shape: {', '.join(SHAPES)})")
    if per_class < 1:
        raise ConfigError(f"per_class={per_class} must be >= 1")
    if not 16 <= min_side <= max_side:
        raise ConfigError(f"min_side={min_side}, max_side={max_side}: need 16 <= min_side <= max_side")
    if not 1 <= quality <= 100:
        raise ConfigError(f"quality={quality} must be a JPEG quality in 1..100")
    jobs = []
    for label, shape in enumerate(SHAPES[:classes]):
        folder = Path(root) / shape
        folder.mkdir(parents=True, exist_ok=True)
        jobs += [(folder / f"{n:05d}.jpg", shape, seed, label, n, min_side, max_side, quality) for n in range(per_class)]
    if threads > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:  # numpy and the JPEG encoder release the GIL
            list(pool.map(_write_one, jobs))
    else:
        for job in jobs:
            _write_one(job)
    return [job[0] for job in jobs]
