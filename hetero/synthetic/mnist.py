"""MNIST's IDX files of synthetic digits, for runs without the real data set.

``write_synthetic(DIR)`` writes ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte`` (and the
``t10k-*`` pair) of drawn seven-segment digits, shifted, scaled and noisy: the files ``hetero
synth`` writes and ``hetero local``, ``hetero plan --profile`` and ``hetero bench`` train on when
no data is given. The MNIST pipeline (``examples.mnist``) reads them like the real files.
"""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

from data_service.errors import ConfigError


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzip when the name ends in .gz)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


# Seven-segment strokes (row0, row1, col0, col1) in a 20 x 12 box, and each digit's segments.
_SEGMENTS = {"a": (0, 3, 0, 12), "b": (0, 10, 9, 12), "c": (10, 20, 9, 12), "d": (17, 20, 0, 12),
             "e": (10, 20, 0, 3), "f": (0, 10, 0, 3), "g": (9, 12, 0, 12)}
_DIGITS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def synthetic_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 28x28 uint8 drawn digits (shifted, scaled, noisy) and their labels."""
    rng = np.random.default_rng(seed)
    templates = np.zeros((10, 20, 12), dtype=np.float32)
    for digit, segs in enumerate(_DIGITS):
        for s in segs:
            r0, r1, c0, c1 = _SEGMENTS[s]
            templates[digit, r0:r1, c0:c1] = 1.0
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = np.zeros((n, 28, 28), dtype=np.float32)
    rows, cols = rng.integers(0, 9, n), rng.integers(0, 17, n)
    scale = rng.uniform(150, 255, n).astype(np.float32)
    for i in range(n):
        images[i, rows[i]:rows[i] + 20, cols[i]:cols[i] + 12] = templates[labels[i]] * scale[i]
    images += rng.normal(0, 30, images.shape).astype(np.float32)
    return np.clip(images, 0, 255).astype(np.uint8), labels


def write_synthetic(out_dir: str | os.PathLike, train: int = 60000, test: int = 10000, seed: int = 0,
                    gz: bool = False) -> list[Path]:
    """Write train (and t10k when ``test`` > 0) IDX files of synthetic digits; returns the paths."""
    if train < 1 or test < 0:
        raise ConfigError(f"train={train} must be >= 1 and test={test} >= 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    written = []
    for split, n, s in (("train", train, seed), ("t10k", test, seed + 1)):
        if n == 0:
            continue
        images, labels = synthetic_digits(n, s)
        for kind, array in (("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels)):
            path = out / f"{split}-{kind}{suffix}"
            write_idx(path, array)
            written.append(path)
    return written
