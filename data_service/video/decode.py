"""Decoding one clip with no more work than its frames need, and never a different pixel.

The levers (docs/video.md), each lossless for the frames a clip returns:

* **seek**: decoding starts at the keyframe at or before the clip's first frame, found in the
  video's :class:`~.probe.VideoIndex` (no scan of the file on open);
* **skip**: a packet whose frame the clip does not return is decoded with FFmpeg's
  ``skip_frame="NONREF"``: a frame that no other frame references is then not decoded at all, and
  none that the clip returns can depend on it;
* **one pass out**: each returned frame is cropped (a pointer offset), scaled and converted to RGB
  by one swscale pass at the output size (an FFmpeg filter graph: ``crop``, ``scale``, ``format``,
  then ``transpose`` for a rotated video), never converted whole first.

:func:`reference_frames` decodes a video whole, in order, with the same graph: what the tests hold
every clip to, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .probe import VideoError, VideoIndex, open_video

INTERPOLATION = "bilinear"


@dataclass(frozen=True)
class Box:
    """The region of a frame a clip keeps, in display coordinates (after rotation), and its output size."""

    top: int
    left: int
    height: int
    width: int
    out_height: int
    out_width: int

    @classmethod
    def whole(cls, index: VideoIndex, out_height: int, out_width: int) -> "Box":
        width, height = index.display_size
        return cls(0, 0, height, width, out_height, out_width)


@dataclass
class DecodeCounts:
    """Frames this process decoded and returned (their ratio is the amplification the levers cut)."""

    decoded: int = 0
    returned: int = 0

    @property
    def per_returned(self) -> float:
        return self.decoded / self.returned if self.returned else 0.0


class ClipDecoder:
    """Decodes clips of videos held in memory to uint8 RGB ``[T, out_height, out_width, 3]``.

    Args:
        skip_nonref: use the skip lever (off: every packet from the keyframe on is decoded).
        seek: use the seek lever (off: decoding starts at the video's first frame).
        threads: FFmpeg decoder threads (1: one core per data worker, the pool gives the parallelism).
    """

    def __init__(self, *, skip_nonref: bool = True, seek: bool = True, threads: int = 1) -> None:
        self.skip_nonref, self.seek, self.threads = skip_nonref, seek, threads
        self.counts = DecodeCounts()

    def clip(self, data: bytes | memoryview, index: VideoIndex, frames: list[int], box: Box) -> np.ndarray:
        """The ``frames`` (frame numbers, in any order, repeats allowed) of the video in ``data``.

        Raises:
            VideoError: the video does not decode up to the last frame asked for (naming the frame).
        """
        if not frames:
            raise ValueError("a clip of no frames")
        wanted = {int(index.pts[f]): f for f in frames}
        first = index.keyframe_before(min(frames)) if self.seek else 0
        got = self._decode(data, index, wanted, box, first)
        if len(got) < len(wanted) and first > 0 and min(got, default=max(wanted) + 1) > min(wanted):
            got = self._decode(data, index, wanted, box, 0)  # the demuxer's seek landed past the keyframe
        if len(got) < len(wanted):
            missing = sorted(f for p, f in wanted.items() if p not in got)
            raise VideoError(f"frame {missing[0]} of {index.frames} never came out of the decoder; the file may "
                             "be cut short: re-encode it, or on_corrupt='skip' drops it")
        self.counts.returned += len(frames)
        return np.stack([got[int(index.pts[f])] for f in frames])

    def _decode(self, data, index: VideoIndex, wanted: dict[int, int], box: Box, first: int) -> dict[int, np.ndarray]:
        """pts -> RGB frame of each wanted frame that decoded, decoding from frame ``first`` (a keyframe)."""
        import av

        got: dict[int, np.ndarray] = {}
        container, stream = open_video(data)
        with container:
            ctx = stream.codec_context
            ctx.thread_count = self.threads
            graph = _Graph(stream, index, box)
            if first > 0:
                container.seek(int(index.pts[first]), stream=stream, backward=True, any_frame=False)
            try:
                for packet in container.demux(stream):  # ends with an empty packet that drains the decoder
                    if self.skip_nonref:
                        ctx.skip_frame = "DEFAULT" if packet.pts is None or packet.pts in wanted else "NONREF"
                    for frame in ctx.decode(packet):
                        self.counts.decoded += 1
                        if frame.pts in wanted and frame.pts not in got:
                            got[frame.pts] = graph(frame)
                    if len(got) == len(wanted):
                        break
            except av.error.FFmpegError as exc:
                missing = sorted(f for p, f in wanted.items() if p not in got)
                raise VideoError(f"frame {missing[0]} does not decode ({exc}); the file may be cut short or "
                                 "damaged: re-encode it, or on_corrupt='skip' drops it") from None
        return got


def reference_frames(data: bytes | memoryview, index: VideoIndex, box: Box) -> dict[int, np.ndarray]:
    """Every frame of the video, decoded whole and in order with no lever, through the same graph:
    frame number -> uint8 ``[out_height, out_width, 3]``."""
    number = {int(p): i for i, p in enumerate(index.pts)}
    container, stream = open_video(data)
    out = {}
    with container:
        stream.codec_context.thread_count = 1
        graph = _Graph(stream, index, box)
        for frame in container.decode(stream):
            if frame.pts in number:
                out[number[frame.pts]] = graph(frame)
    return out


class _Graph:
    """crop -> scale (with the colour conversion) -> rgb24 -> transpose: one swscale pass a frame."""

    def __init__(self, stream, index: VideoIndex, box: Box) -> None:
        import av.filter

        # even offsets and sizes: a crop of subsampled chroma at an odd pixel would shift its phase
        top, left, height, width = (v - v % 2 for v in _coded_box(index, box))
        height, width = max(2, min(height, index.height - top)), max(2, min(width, index.width - left))
        out_w, out_h = (box.out_height, box.out_width) if index.rotation in (90, 270) else \
            (box.out_width, box.out_height)
        self.graph = av.filter.Graph()
        chain = [self.graph.add_buffer(template=stream)]
        if (top, left, height, width) != (0, 0, index.height, index.width):
            chain.append(self.graph.add("crop", f"{width}:{height}:{left}:{top}:exact=1"))
        chain.append(self.graph.add("scale", f"{out_w}:{out_h}:flags={INTERPOLATION}"))
        chain.append(self.graph.add("format", "rgb24"))
        if index.rotation == 180:
            chain += [self.graph.add("hflip"), self.graph.add("vflip")]
        elif index.rotation in (90, 270):
            chain.append(self.graph.add("transpose", "cclock" if index.rotation == 90 else "clock"))
        chain.append(self.graph.add("buffersink"))
        for a, b in zip(chain, chain[1:]):
            a.link_to(b)
        self.graph.configure()

    def __call__(self, frame) -> np.ndarray:
        self.graph.push(frame)
        return self.graph.pull().to_ndarray()


def _coded_box(index: VideoIndex, box: Box) -> tuple[int, int, int, int]:
    """``box`` (display coordinates) in the coded frame's: (top, left, height, width). The display is
    the coded frame turned ``rotation`` degrees counter-clockwise (``np.rot90`` ``rotation // 90`` times)."""
    t, l, h, w = box.top, box.left, box.height, box.width
    if index.rotation == 90:
        return l, index.width - t - h, w, h
    if index.rotation == 180:
        return index.height - t - h, index.width - l - w, h, w
    if index.rotation == 270:
        return index.height - l - w, t, w, h
    return t, l, h, w
