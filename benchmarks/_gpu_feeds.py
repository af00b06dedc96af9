"""The feeds of ``benchmarks.gpu``: each yields ``(images, labels)`` on the training device,
finished (normalised float32, NCHW), and says how much CPU its data side has used.

* ``resident``: a few synthetic batches made once on the device: the limit.
* ``servers``: our data server (``hetero serve``, ``k`` workers) pinned to the data cores;
  the trainer reads ``RemoteDataset -> ResumableLoader -> DeviceFeeder``.
* ``local``: the homogeneous path: ``LocalDataset`` in ``k`` DataLoader workers pinned to the
  data cores, ``ResumableLoader -> DeviceFeeder`` in the trainer.
* ``gpu-decode`` and ``dali``: the GPU-decode peers (:mod:`benchmarks._gpu_decode`).

Every call that needs a GPU goes through ``Device`` (CUDA streams and events, the decoder's
device): on CPU the same code runs with CPU decode and no events, so the logic is checked
without a GPU.
"""
from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from hetero.planning.profile import pinned  # noqa: F401  (the feeds' and gpu.py's)

from .common.proc import descendants, tree_cpu, usage

PIPELINE = "data_service.pipelines.images:build_pipeline"
TOKEN = "gpu-bench"


class Device:
    """The device-specific calls of the benchmark: CUDA where the device is CUDA, no-ops on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def event(self) -> Any:
        """An event recorded now on the current stream (None on CPU)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def busy_s(self, pairs: list[tuple[Any, Any]]) -> float | None:
        """Device seconds between each (start, end) event pair, summed (None on CPU)."""
        if not self.cuda:
            return None
        self.synchronize()
        return sum(a.elapsed_time(b) for a, b in pairs) / 1000

    def utilization(self) -> float | None:
        """NVML's GPU utilisation in percent, where pynvml is installed (None otherwise)."""
        if not self.cuda:
            return None
        try:
            return float(torch.cuda.utilization(self.device))
        except Exception:  # pynvml absent, or no NVML
            return None

    def side_stream(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(torch.cuda.Stream(self.device)) if self.cuda else contextlib.nullcontext()

    def decode(self, datas: list[torch.Tensor]) -> list[torch.Tensor]:
        """One call decodes the batch: batched nvJPEG on CUDA, torchvision's CPU decoder on CPU."""
        from torchvision.io import ImageReadMode, decode_jpeg

        device = self.device if self.cuda else "cpu"
        try:
            return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)
        except TypeError:  # torchvision before 0.19 decodes one image per call
            return [decode_jpeg(d, mode=ImageReadMode.RGB, device=device) for d in datas]

    def hand_over(self, tensors: list[torch.Tensor]) -> Any:
        """Mark tensors made on a side stream as ready; returns what ``take`` waits on."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def take(self, token: Any, tensors: list[torch.Tensor]) -> None:
        if token is None:
            return
        current = torch.cuda.current_stream(self.device)
        current.wait_event(token)
        for t in tensors:
            t.record_stream(current)


@dataclass
class Feed:
    """Batches on the device, and the CPU seconds the data side has used so far."""

    name: str
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    data_cpu: Callable[[], float] | None   # None: not measurable apart from the trainer's
    in_trainer: bool = False              # the data side runs in the trainer process (a thread)
    close: Callable[[], None] = lambda: None
    notes: dict = field(default_factory=dict)


def channels_last(images: torch.Tensor) -> torch.Tensor:
    return images.contiguous(memory_format=torch.channels_last)


def _endless(stage, epochs: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Epoch after epoch of a ``DeviceFeeder`` as (images, labels)."""
    for epoch in range(epochs):
        stage.set_epoch(epoch)
        for batch in stage:
            yield channels_last(batch["image"]), batch["label"]
    raise RuntimeError(f"the feed ran out after {epochs} epochs; raise the epochs it is made with")


def resident(dev: Device, batch: int, size: int, classes: int = 10, count: int = 4) -> Feed:
    """``count`` finished batches made once on the device, yielded in turn."""
    g = torch.Generator().manual_seed(0)
    pool = [(channels_last(torch.randn(batch, 3, size, size, generator=g).to(dev.device)),
             torch.randint(0, classes, (batch,), generator=g).to(dev.device)) for _ in range(count)]

    def batches():
        while True:
            yield from pool
    return Feed("resident", batches(), lambda: 0.0)


def _options(folder: str, images: int, batch: int, size: int) -> dict:
    return {"data_dir": folder, "limit": images, "batch_size": batch, "image_size": size}


def servers(dev: Device, folder: str, images: int, batch: int, size: int, data_cores: list[int], epochs: int,
            shared_memory: bool = False) -> Feed:
    """Our data server with one worker per data core, pinned there; the trainer reads it as a DNN node does."""
    from torch.utils.data import DataLoader

    from dnn_worker import DeviceFeeder, RemoteDataset, ResumableLoader
    from hetero.testing.processes import ServerProc

    server = ServerProc(_options(folder, images, batch, size), workers=len(data_cores), pipeline=PIPELINE,
                        token=TOKEN)
    with pinned(data_cores):  # the server and its workers inherit the data cores
        server.start(timeout=300.0)
    try:
        ds = RemoteDataset([server.address], TOKEN, seed=0, epochs=epochs, shared_memory=shared_memory,
                           pin_memory=dev.cuda, connect_timeout=120.0)
        feeder = DeviceFeeder(ResumableLoader(DataLoader(ds, batch_size=None, num_workers=0)), dev.device,
                              finish=ds.finish_stage(), depth=2, pin_memory=dev.cuda)
    except BaseException:
        server.stop()
        raise

    return Feed("servers", _endless(feeder, epochs), lambda: tree_cpu(server.pid), close=server.stop,
                notes={"transport": "shared memory" if shared_memory else "TCP (loopback)"})


def _worker_on(cores: list[int], worker_id: int) -> None:
    """A DataLoader worker on the data cores, one thread (as a data server's worker)."""
    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(1)


def local(dev: Device, folder: str, images: int, batch: int, size: int, data_cores: list[int], epochs: int) -> Feed:
    """The homogeneous path: ``LocalDataset`` in one DataLoader worker per data core, pinned there."""
    from torch.utils.data import DataLoader

    from data_service.contract.pipeline import PipelineSpec
    from dnn_worker import DeviceFeeder, LocalDataset, ResumableLoader

    ds = LocalDataset(PipelineSpec(PIPELINE, _options(folder, images, batch, size)), seed=0, epochs=epochs)
    loader = ResumableLoader(DataLoader(ds, batch_size=None, num_workers=len(data_cores), pin_memory=dev.cuda,
                                        persistent_workers=True,
                                        worker_init_fn=functools.partial(_worker_on, sorted(data_cores)),
                                        multiprocessing_context="forkserver"))
    feeder = DeviceFeeder(loader, dev.device, finish=ds.finish_stage(), depth=2, pin_memory=dev.cuda)
    me = os.getpid()
    return Feed("local", _endless(feeder, epochs), lambda: usage(descendants(me))[0], close=loader.close)


def image_files(folder: str, images: int) -> list[tuple[str, int]]:
    """The first ``images`` JPEGs of ``folder/<class>/*.jpg`` (sorted) with their class index."""
    classes = sorted(p.name for p in Path(folder).iterdir() if p.is_dir())
    files = sorted((str(p), classes.index(p.parent.name)) for p in Path(folder).glob("*/*.jpg"))
    return files[:images]
