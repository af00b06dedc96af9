"""A synthetic pipeline with knobs for tests and benchmarks.

``examples.synthetic:build_pipeline`` makes deterministic uint8 "images" from
the sample index, a random augmentation (so determinism is tested for real),
and optional failure injection.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import torch

from data_service import Pipeline


class SyntheticImages:
    """Map-style dataset: sample i is (uint8 image from i, label i % 10)."""

    def __init__(self, size: int, shape: tuple[int, ...], fail_at: int | None, crash_once_at: int | None,
                 crash_marker: str | None) -> None:
        self.size = size
        self.shape = tuple(shape)
        self.fail_at = fail_at
        self.crash_once_at = crash_once_at
        self.crash_marker = crash_marker

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise ValueError(f"synthetic failure on sample {i}")
        if i == self.crash_once_at and self.crash_marker and not os.path.exists(self.crash_marker):
            open(self.crash_marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # a hard worker death, not an exception
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, self.shape, dtype=torch.uint8, generator=g), i % 10


class Augment:
    """Random noise + random flip from torch's global RNG, like a real augmentation."""

    def __init__(self, work_ms: float = 0.0, sleep_ms: float = 0.0) -> None:
        self.work_ms = work_ms
        self.sleep_ms = sleep_ms

    def __call__(self, sample):
        image, label = sample
        if self.sleep_ms:  # wall time without CPU: data nodes of it add capacity on any machine
            time.sleep(self.sleep_ms / 1000.0)
        if self.work_ms:
            end = time.perf_counter() + self.work_ms / 1000.0
            while time.perf_counter() < end:  # CPU work, not sleep: it must load a core
                pass
        noise = torch.randint(-3, 4, image.shape, dtype=torch.int16)
        image = (image.to(torch.int16) + noise).clamp(0, 255).to(torch.uint8)
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return {"image": image, "label": torch.tensor(label, dtype=torch.int64)}


def build_pipeline(size: int = 64, batch_size: int = 8, shape: list[int] | None = None, drop_last: bool = False,
                   shuffle: bool = True, fail_at: int | None = None, crash_once_at: int | None = None,
                   crash_marker: str | None = None, work_ms: float = 0.0, as_tuple: bool = False,
                   die_loading: int = 0, die_loading_dir: str | None = None, sleep_ms: float = 0.0) -> Pipeline:
    """Args:
        size: samples in the dataset. batch_size: samples per batch. shape: image shape (default 1x8x8).
        fail_at: sample index whose loading raises ValueError.
        crash_once_at, crash_marker: sample index whose loading SIGKILLs the worker once (marker file).
        work_ms: busy CPU time per sample (a CPU-heavy augmentation).
        sleep_ms: wall time per sample without CPU (a sleep): each data node of it adds the same
            capacity, as nodes with cores of their own would, even on a 2-core machine.
        as_tuple: collate to (image, label) instead of a dict.
        die_loading, die_loading_dir: the first ``die_loading`` data worker processes to load this
            pipeline SIGKILL themselves while loading (one file per death in the directory; armed
            while the directory exists).
    """
    if die_loading and multiprocessing.parent_process() is not None:  # a worker, not the server itself
        deaths = os.listdir(die_loading_dir) if os.path.isdir(die_loading_dir) else None
        if deaths is not None and len(deaths) < die_loading:
            open(os.path.join(die_loading_dir, f"{len(deaths)}-{os.getpid()}"), "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    dataset = SyntheticImages(size, tuple(shape or (1, 8, 8)), fail_at, crash_once_at, crash_marker)
    collate = None
    if as_tuple:
        def collate(samples):
            return (torch.stack([s["image"] for s in samples]), torch.stack([s["label"] for s in samples]))
    return Pipeline(dataset=dataset, batch_size=batch_size, transform=Augment(work_ms, sleep_ms), collate_fn=collate,
                    drop_last=drop_last, shuffle=shuffle)


class _Blob:
    def __init__(self, size: int, nbytes: int) -> None:
        self.size = size
        self.payload = torch.arange(nbytes, dtype=torch.int64).to(torch.uint8)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        return self.payload


def build_blob_pipeline(size: int = 64, batch_bytes: int = 1 << 20) -> Pipeline:
    """One pre-made ``batch_bytes`` tensor per batch: measures transport, not preprocessing."""
    return Pipeline(dataset=_Blob(size, batch_bytes), batch_size=1, collate_fn=lambda s: {"blob": s[0]},
                    shuffle=False)


def normalize(batch):
    """Device-side finish stage: uint8 images -> float32 in [0, 1], then standardised."""
    out = dict(batch)
    out["image"] = (batch["image"].to(torch.float32) / 255.0 - 0.5) / 0.25
    return out


def build_finished_pipeline(finish_on: str = "device", finish: str = "", **kwargs) -> Pipeline:
    """``build_pipeline`` whose images are normalised on the consumer's device (``finish_on="device"``,
    uint8 on the wire) or on the data server (``"server"``, float32 on the wire). ``finish``: another
    device-side stage by import path (default :func:`normalize`)."""
    pipe = build_pipeline(**kwargs)
    if finish_on == "device":
        pipe.finish, pipe.finish_dtypes = finish or normalize, {"image": "float32"}
    elif finish_on == "server":
        pipe.collate_fn = lambda samples: normalize(torch.utils.data.default_collate(samples))
    else:
        raise ValueError(f"finish_on={finish_on!r} must be 'device' or 'server'")
    return pipe


def bad_finish_shape(batch):
    return {"image": batch["image"].flatten(1).float(), "label": batch["label"]}


def bad_finish_dtype(batch):
    return {"image": batch["image"].double(), "label": batch["label"]}
