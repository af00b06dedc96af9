"""The video pipeline: clips of ``frames_per_clip`` frames decoded with no more work than they need,
cropped and flipped alike in every frame; from a folder of videos (Kinetics' layout).

Plug-in points used by the launcher (``--hp pipeline=data_service.pipelines.video:build_pipeline``):

* ``data_service.pipelines.video:build_pipeline``: uint8 clips ``{"video": [B, 3, T, S, S], "label": [B]}``
  on the wire (``layout="BTCHW"``: ``[B, T, 3, S, S]``);
* ``data_service.pipelines.video:finish``: the device-side last stage (uint8 -> float32, normalised
  with the Kinetics statistics torchvision's video models were trained with).

The parts: :mod:`data_service.video` (the index of a video's frames, the clip sampler, the decoder
and its levers), :mod:`.video_options` (the options, checked), :func:`.sources.scan` (the folder).
A clip's frames, crop and flip are drawn from the batch's generator, so a clip is a pure function of
(seed, epoch, batch index): bit-identical on any data node and in the homogeneous mode.
"""
from __future__ import annotations

import inspect
from collections import OrderedDict
from dataclasses import fields
from typing import Any

import torch

from ..contract.on_corrupt import OnCorrupt
from ..contract.pipeline import Pipeline, ServerSide, SkipSample
from ..errors import ConfigError
from ..video.clips import ClipShape, TooShort
from ..video.decode import Box, ClipDecoder
from ..video.probe import VideoError, VideoIndex, probe
from .crop_decode import BoxDraw
from .sources import data_root, scan
from .video_options import VIDEO_EXTENSIONS, VideoOptions

__all__ = ["FINISH_DTYPES", "MEAN", "STD", "VIDEO_EXTENSIONS", "ClipAugment", "VideoFolder", "VideoOptions",
           "build_pipeline", "collate", "finish"]

# Kinetics-400 statistics (torchvision's video models), on the 0..255 scale.
MEAN = (0.43216 * 255, 0.394666 * 255, 0.37645 * 255)
STD = (0.22803 * 255, 0.22145 * 255, 0.216989 * 255)
FINISH_DTYPES = {"video": "float32"}
INDEXES_KEPT = 4096  # video indexes a worker keeps (a folder's videos are probed on first use)


class VideoFolder:
    """Map-style over ``root/<class>/*.mp4`` (and .mkv, .webm, .mov, .avi): sample ``i`` is
    ``((file bytes, path), label)`` of video ``i // clips_per_video``.

    Args:
        root: the folder. limit: use only the first ``limit`` videos in sorted order (0 = all).
        clips_per_video: samples (clips, each drawn anew) of every video in an epoch.
    """

    def __init__(self, root: str, limit: int = 0, clips_per_video: int = 1) -> None:
        self.root = root
        self.classes, self.videos = scan(root, VIDEO_EXTENSIONS, "video")
        if limit:
            self.videos = self.videos[:limit]
        self.clips_per_video = clips_per_video

    def __len__(self) -> int:
        return len(self.videos) * self.clips_per_video

    def __getitem__(self, i: int):
        path, label = self.videos[i // self.clips_per_video]
        with open(path, "rb") as f:
            return (f.read(), path), label


class ClipAugment:
    """``((video bytes, name), label)`` -> (uint8 clip ``[T, 3, S, S]``, label): draws the clip's frames,
    then its crop, then its flip, from torch's generator (seeded per batch), and decodes only them.

    A video that cannot be served is a :class:`VideoError` naming it and the fix, or with
    ``on_corrupt="skip"`` (and for a video shorter than a clip with ``short_video="skip"``) a
    :class:`SkipSample`.
    """

    def __init__(self, opts: VideoOptions) -> None:
        self.opts = opts
        self.clip_shape: ClipShape = opts.clip
        self.decoder = ClipDecoder(skip_nonref=opts.levers == "all", seek=opts.levers != "none")
        self.box_draw = BoxDraw((float(opts.min_scale), 1.0))
        self.indexes: OrderedDict[str, VideoIndex] = OrderedDict()

    @property
    def counts(self) -> dict[str, float]:
        """Frames decoded and returned in this process (their ratio: what the levers saved)."""
        c = self.decoder.counts
        return {"video_frames_decoded": c.decoded, "video_frames_returned": c.returned,
                "video_decoded_per_returned": round(c.per_returned, 3)}

    def __call__(self, sample):
        (data, name), label = sample
        try:
            index = self._index(data, name)
            frames = self.clip_shape.frames_of(index.frames)
            box = self._box(index)
            flip = bool(self.opts.flip and torch.rand(1).item() < 0.5)
            clip = torch.from_numpy(self.decoder.clip(data, index, frames, box))  # [T, S, S, 3]
        except TooShort as exc:
            raise SkipSample(f"{name}: {exc}", where=name) from None
        except VideoError as exc:
            if self.opts.on_corrupt is OnCorrupt.SKIP:
                raise SkipSample(f"{name}: {exc}", where=name) from None
            raise VideoError(f"{name}: {exc}; or pass pipeline.on_corrupt=skip to drop such videos (counted in the "
                             "data server's samples_skipped)") from None
        clip = clip.permute(0, 3, 1, 2)  # [T, 3, S, S], a view: collate makes it contiguous
        return (clip.flip(-1) if flip else clip), label

    def _index(self, data: bytes, name: str) -> VideoIndex:
        index = self.indexes.get(name)
        if index is None:
            index = self.indexes[name] = probe(data)
            if len(self.indexes) > INDEXES_KEPT:
                self.indexes.popitem(last=False)
        else:
            self.indexes.move_to_end(name)
        return index

    def _box(self, index: VideoIndex) -> Box:
        """The crop of every frame of the clip, in display coordinates, drawn as ``crop`` says."""
        width, height = index.display_size
        size = self.opts.image_size
        if self.opts.crop == "random-resized":
            top, left, h, w = self.box_draw(height, width)
            return Box(top, left, h, w, size, size)
        scale = self.opts.side / min(width, height)  # the short side resized to ``side``, then a square
        side = min(round(size / scale), width, height)  # of ``size`` cut from it: in source pixels
        if self.opts.crop == "center":
            return Box((height - side) // 2, (width - side) // 2, side, side, size, size)
        top = int(torch.randint(height - side + 1, (1,)).item())
        left = int(torch.randint(width - side + 1, (1,)).item())
        return Box(top, left, side, side, size, size)


def collate(samples) -> dict:
    """Stack clips into ``{"video": uint8 [B, T, 3, S, S], "label": int64 [B]}``."""
    return {"video": torch.stack([c for c, _ in samples]), "label": torch.tensor([lb for _, lb in samples])}


def collate_bcthw(samples) -> dict:
    """Stack clips into ``{"video": uint8 [B, 3, T, S, S], "label": int64 [B]}`` (torchvision's video layout)."""
    return {"video": torch.stack([c.transpose(0, 1) for c, _ in samples]),
            "label": torch.tensor([lb for _, lb in samples])}


def finish(batch: dict) -> dict:
    """The device-side last stage: uint8 clips -> float32, normalised per channel (Kinetics mean/std),
    in either layout (the channel axis is the one of length 3 after the batch's)."""
    video = batch["video"]
    axis = 1 if video.shape[1] == 3 else 2
    shape = [1] * video.dim()
    shape[axis] = 3
    scale = torch.tensor([1 / s for s in STD], dtype=torch.float32, device=video.device).view(shape)
    shift = torch.tensor([-m / s for m, s in zip(MEAN, STD)], dtype=torch.float32, device=video.device).view(shape)
    return {**batch, "video": video.to(torch.float32).mul_(scale).add_(shift)}


def build_pipeline(**options) -> Pipeline:
    """Video clip batches ``{"video": uint8 [B, 3, T, S, S], "label": int64 [B]}``.

    Args:
        batch_size: clips per batch (a batch with skipped samples is that many shorter); 8.
        frames_per_clip, frame_stride: a clip is ``frames_per_clip`` frames (16), ``frame_stride`` (2)
            frames apart, from a start drawn uniformly over the video.
        clips_per_video: clips drawn from each video in an epoch (each a sample); 1.
        short_video: a video shorter than a clip: ``"pad"`` repeats its last frame (default),
            ``"loop"`` starts it again, ``"skip"`` drops the sample (counted in ``samples_skipped``).
        image_size: side of the square crop (224). short_side: with ``crop="random"`` or
            ``"center"``, the short side the frame is resized to before the crop (0 = 1.15 x image_size).
        crop: ``"random"``, ``"center"`` or ``"random-resized"`` (``RandomResizedCrop(image_size,
            scale=(min_scale, 1))`` as the image pipeline); the same crop for every frame of a clip.
        flip: a horizontal flip of the whole clip, half the time (True).
        on_corrupt: ``"fail"``: a video that does not decode stops the job, naming it and the frame;
            ``"skip"``: drop that sample, counted in ``samples_skipped``.
        limit: use only the first ``limit`` videos (0 = all). data_dir: the folder; default
            ``SM_CHANNEL_TRAINING``. drop_last: leave out the last, short batch (True).
        layout: ``"BCTHW"`` (torchvision's video models) or ``"BTCHW"``.
        levers: ``"all"`` (seek to the keyframe before the clip, skip frames nothing references),
            ``"seek"``, or ``"none"`` (decode every frame from the first: a baseline for benchmarks).
            The frames a clip returns are the same, bit for bit, whichever is chosen.

    Raises:
        ConfigError: a bad option (:class:`VideoOptions`), a folder without videos, fewer clips than
            one batch with ``drop_last``.
    """
    opts = VideoOptions.from_kwargs(**options)
    dataset = VideoFolder(data_root(opts.data_dir), opts.limit, opts.clips_per_video)
    if opts.drop_last and len(dataset) < opts.batch_size:
        raise ConfigError(f"{dataset.root!r} holds {len(dataset)} clips an epoch, fewer than "
                          f"batch_size={opts.batch_size} with drop_last=true: no batch at all; lower batch_size, "
                          "raise clips_per_video or add videos")
    augment = ClipAugment(opts)
    return Pipeline(dataset=dataset, batch_size=opts.batch_size, transform=augment, drop_last=opts.drop_last,
                    shuffle=True, collate_fn=collate_bcthw if opts.layout == "BCTHW" else collate, finish=finish,
                    finish_dtypes=FINISH_DTYPES, stats=lambda: augment.counts)


def server_side(**options) -> ServerSide:
    """A data server's main process keeps nothing of this pipeline (the options are checked)."""
    VideoOptions.from_kwargs(**options)
    return ServerSide()


def worker_imports(**options) -> list[str]:
    """What a data worker imports to build and run the pipeline (its warm parent imports them once)."""
    VideoOptions.from_kwargs(**options)
    return ["av", "av.filter", "numpy"]


_builder: Any = build_pipeline
_builder.server_side = server_side
_builder.worker_imports = worker_imports
_builder.__signature__ = inspect.Signature(
    [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
     for f in fields(VideoOptions) if f.init], return_annotation="Pipeline")
_builder.input_modes = ("File", "FastFile")
