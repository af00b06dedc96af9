"""The GPU-decode peers of ``benchmarks.gpu``, feeds as :mod:`benchmarks._gpu_feeds` makes them.

* ``gpu-decode``: a thread pinned to the data cores reads the JPEGs, decodes each batch with
  ``torchvision.io.decode_jpeg(device=...)`` in one call and crops (``RandomResizedCrop``'s draw),
  resizes and flips on the device, then the pipeline's own finish stage.
* ``dali``: DALI's GPU decoder (``decoders.image_random_crop(device="mixed")``), where installed.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import Iterator

import torch

from ._gpu_feeds import Device, Feed, channels_last, image_files, pinned


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
        images = channels_last(finish({"image": torch.stack(crops)})["image"])  # the pipeline's own finish stage
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
            while not self.stop.is_set():
                try:
                    self.queue.put(None, timeout=0.1)
                    return
                except queue.Full:
                    pass

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


def gpu_decode(dev: Device, folder: str, images: int, batch: int, size: int, data_cores: list[int]) -> Feed:
    feed = GpuDecode(dev, image_files(folder, images), batch, size, data_cores)
    return Feed("gpu-decode", iter(feed), lambda: feed.cpu_s, in_trainer=True, close=feed.close,
                notes={"decoder": f"torchvision.io.decode_jpeg(device={'cuda' if dev.cuda else 'cpu'!r})"})


def dali_available(dev: Device) -> str | None:
    """None where DALI's GPU decoder can run here, else why not."""
    if not dev.cuda:
        return "DALI's GPU decoder needs a CUDA device"
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
                yield channels_last(out[0]["image"]), out[0]["label"].view(-1).long()
    return Feed("dali", batches(), None, in_trainer=True,  # DALI's threads: counted in the trainer's CPU
                notes={"decoder": "DALI decoders.image_random_crop(device='mixed')"})
