"""The feeds of ``benchmarks.gpu``: each yields ``(images, labels)`` on the training device,
finished (normalised float32, NCHW), and says how much CPU its data side has used.

* ``resident``: a few synthetic batches made once on the device: the limit.
* ``servers``: our data server (``hetero serve``, ``k`` workers) pinned to the data cores;
  the trainer reads ``RemoteDataset -> ResumableLoader -> DeviceFeeder``.
* ``local``: the homogeneous path: ``LocalDataset`` in ``k`` DataLoader workers pinned to the
  data cores, ``ResumableLoader -> DeviceFeeder`` in the trainer.
* ``gpu-decode``: a thread pinned to the data cores reads the JPEGs, decodes each batch with
  ``torchvision.io.decode_jpeg(device=...)`` and crops, resizes and flips on the device.
* ``dali``: DALI's GPU decoder (``decoders.image_random_crop(device="mixed")``), where installed.

Every call that needs a GPU goes through ``Device`` (CUDA streams and events, the decoder's
device): on CPU the same code runs with CPU decode and no events, so the logic is checked
without a GPU.
"""
from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ._proc import descendants, usage

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

        return decode_jpeg(datas, mode=ImageReadMode.RGB, device=self.device if self.cuda else "cpu")

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
    data_cpu: Callable[[], float]
    in_trainer: bool = False              # the data side runs in the trainer process (a thread)
    close: Callable[[], None] = lambda: None
    notes: dict = field(default_factory=dict)


@contextlib.contextmanager
def pinned(cores: list[int]) -> Iterator[None]:
    """This thread (and the processes and threads it starts meanwhile) on ``cores``."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _channels_last(images: torch.Tensor) -> torch.Tensor:
    return images.contiguous(memory_format=torch.channels_last)


def _endless(stage, epochs: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Epoch after epoch of a ``DeviceFeeder`` as (images, labels)."""
    for epoch in range(epochs):
        stage.set_epoch(epoch)
        for batch in stage:
            yield _channels_last(batch["image"]), batch["label"]
    raise RuntimeError(f"the feed ran out after {epochs} epochs; raise the epochs it is made with")


def resident(dev: Device, batch: int, size: int, classes: int = 10, count: int = 4) -> Feed:
    """``count`` finished batches made once on the device, yielded in turn."""
    g = torch.Generator().manual_seed(0)
    pool = [(_channels_last(torch.randn(batch, 3, size, size, generator=g).to(dev.device)),
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

    def data_cpu() -> float:
        return usage([server.pid, *descendants(server.pid)])[0]
    return Feed("servers", _endless(feeder, epochs), data_cpu, close=server.stop,
                notes={"transport": "shared memory" if shared_memory else "TCP (loopback)"})


def _worker_on(cores: list[int], worker_id: int) -> None:
    """A DataLoader worker on the data cores, one thread (as a data server's worker)."""
    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(1)


def local(dev: Device, folder: str, images: int, batch: int, size: int, data_cores: list[int], epochs: int) -> Feed:
    """The homogeneous path: ``LocalDataset`` in one DataLoader worker per data core, pinned there."""
    from torch.utils.data import DataLoader

    from data_service.pipeline import PipelineSpec
    from dnn_worker import DeviceFeeder, LocalDataset, ResumableLoader

    ds = LocalDataset(PipelineSpec(PIPELINE, _options(folder, images, batch, size)), seed=0, epochs=epochs)
    loader = ResumableLoader(DataLoader(ds, batch_size=None, num_workers=len(data_cores), pin_memory=dev.cuda,
                                        persistent_workers=True,
                                        worker_init_fn=functools.partial(_worker_on, sorted(data_cores)),
                                        multiprocessing_context="forkserver"))
    feeder = DeviceFeeder(loader, dev.device, finish=ds.finish_stage(), depth=2, pin_memory=dev.cuda)
    me = os.getpid()
    return Feed("local", _endless(feeder, epochs), lambda: usage(descendants(me))[0], close=loader.close)


class GpuDecode:
    """A thread on the data cores: read a batch of JPEGs, decode it on the device in one call,
    then a random crop (``RandomResizedCrop``'s draw), resize to ``size`` and flip, on the device."""

    def __init__(self, dev: Device, files: list[tuple[str, int]], batch: int, size: int, data_cores: list[int],
                 depth: int = 2) -> None:
        from data_service.pipelines.crop_decode import BoxDraw

        self.dev, self.files, self.batch, self.size, self.cores = dev, files, batch, size, set(data_cores)
        self.draw = BoxDraw((0.08, 1.0))
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.cpu_s = 0.0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="gpu-decode", daemon=True)
        self.thread.start()

    def _one(self, chunk: list[tuple[str, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        from torchvision.transforms.v2 import functional as F

        from data_service.pipelines.images import finish

        datas = []
        for path, _ in chunk:
            with open(path, "rb") as f:
                datas.append(torch.frombuffer(bytearray(f.read()), dtype=torch.uint8))
        crops = []
        for image in self.dev.decode(datas):
            top, left, h, w = self.draw(image.shape[-2], image.shape[-1])
            crop = F.resized_crop(image, top, left, h, w, [self.size, self.size], antialias=True)
            crops.append(crop.flip(-1) if torch.rand(1).item() < 0.5 else crop)
        images = _channels_last(finish({"image": torch.stack(crops)})["image"])  # the pipeline's own finish stage
        labels = torch.tensor([label for _, label in chunk]).to(self.dev.device, non_blocking=True)
        return images, labels

    def _run(self) -> None:
        os.sched_setaffinity(0, self.cores)  # this thread only
        g = torch.Generator().manual_seed(0)
        try:
            with self.dev.side_stream():
                while not self.stop.is_set():
                    order = torch.randperm(len(self.files), generator=g).tolist()
                    for start in range(0, len(order) - self.batch + 1, self.batch):
                        t = time.thread_time()
                        out = self._one([self.files[i] for i in order[start:start + self.batch]])
                        token = self.dev.hand_over(list(out))
                        self.cpu_s += time.thread_time() - t
                        while not self.stop.is_set():
                            try:
                                self.queue.put((out, token), timeout=0.1)
                                break
                            except queue.Full:
                                pass
                        if self.stop.is_set():
                            return
        except BaseException as exc:  # shown to the trainer at its next batch
            self.error = exc
            self.queue.put(None)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            try:
                item = self.queue.get(timeout=300.0)
            except queue.Empty:
                raise TimeoutError("the gpu-decode thread made no batch in 300 s") from None
            if item is None:
                raise RuntimeError(f"gpu-decode failed: {self.error!r}") from self.error
            out, token = item
            self.dev.take(token, list(out))
            yield out

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30.0)


def image_files(folder: str, images: int) -> list[tuple[str, int]]:
    """The first ``images`` JPEGs of ``folder/<class>/*.jpg`` (sorted) with their class index."""
    classes = sorted(p.name for p in Path(folder).iterdir() if p.is_dir())
    files = sorted((str(p), classes.index(p.parent.name)) for p in Path(folder).glob("*/*.jpg"))
    return files[:images]


def gpu_decode(dev: Device, folder: str, images: int, batch: int, size: int, data_cores: list[int]) -> Feed:
    feed = GpuDecode(dev, image_files(folder, images), batch, size, data_cores)
    return Feed("gpu-decode", iter(feed), lambda: feed.cpu_s, in_trainer=True, close=feed.close,
                notes={"decoder": f"torchvision.io.decode_jpeg(device={'cuda' if dev.cuda else 'cpu'!r})"})


def dali_available() -> str | None:
    """None where DALI can run here, else why not."""
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as exc:
        return f"DALI is not installed ({exc})"
    return None


def dali(dev: Device, folder: str, images: int, batch: int, size: int, data_cores: list[int]) -> Feed:
    """DALI's ``mixed`` decoder (nvJPEG, host Huffman decoding on ``len(data_cores)`` threads)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    files = image_files(folder, images)

    @pipeline_def(batch_size=batch, num_threads=len(data_cores), device_id=dev.device.index or 0, seed=0)
    def pipe():
        jpegs, labels = fn.readers.file(files=[f for f, _ in files], labels=[c for _, c in files],
                                        random_shuffle=True, name="reader")
        out = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB,
                                            random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        out = fn.resize(out, resize_x=size, resize_y=size)
        out = fn.crop_mirror_normalize(out, dtype=types.FLOAT, output_layout="CHW",
                                       mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                       std=[0.229 * 255, 0.224 * 255, 0.225 * 255], mirror=fn.random.coin_flip())
        return out, labels.gpu()

    with pinned(data_cores):  # DALI's worker threads start here
        p = pipe()
        p.build()
    it = DALIGenericIterator([p], ["image", "label"], reader_name="reader", auto_reset=True)

    def batches():
        while True:
            for out in it:
                yield _channels_last(out[0]["image"]), out[0]["label"].view(-1).long()
    return Feed("dali", batches(), lambda: 0.0, in_trainer=True,
                notes={"decoder": "DALI decoders.image_random_crop(device='mixed')",
                       "data_cpu": "in the trainer process (DALI threads): see trainer CPU"})
