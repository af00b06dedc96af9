"""What a clip decoder must know of a video before it decodes a frame: its frames' timestamps in
presentation order and which of them are keyframes, read from the container's packets (no frame is
decoded), with the stream's codec, size, pixel format and rotation.

``probe(data)`` reads a video held in memory (a file's bytes, a shard member, an S3 range) and
gives a :class:`VideoIndex`; ``hetero prepare --videos`` stores it beside the video so a data
node never scans a file on open. A video the demuxer cannot read, or one without a video stream,
is a :class:`VideoError` naming the reason.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Self

import numpy as np

from ..errors import ConfigError, install_extra


class VideoError(ValueError):
    """A video that cannot be served: no video stream, unreadable, cut short, no frames."""


@dataclass(frozen=True)
class VideoIndex:
    """One video's frames as the decoder sees them.

    ``pts``: every frame's presentation timestamp (in ``time_base`` units), in presentation order,
    so frame ``i`` of the clip sampler is ``pts[i]``; ``keyframes``: the frame numbers (indices into
    ``pts``) of the packets flagged as keyframes, ascending. ``rotation``: degrees counter-clockwise
    the frames are turned for display (a phone's metadata; 0, 90, 180 or 270).
    """

    codec: str
    width: int
    height: int
    pix_fmt: str
    time_base: Fraction
    rotation: int
    pts: np.ndarray
    keyframes: np.ndarray

    @property
    def frames(self) -> int:
        return len(self.pts)

    @property
    def fps(self) -> float:
        """Mean frames per second over the video (0 for a single frame)."""
        span = float((int(self.pts[-1]) - int(self.pts[0])) * self.time_base) if self.frames > 1 else 0.0
        return (self.frames - 1) / span if span > 0 else 0.0

    @property
    def display_size(self) -> tuple[int, int]:
        """(width, height) as shown, after the rotation."""
        return (self.height, self.width) if self.rotation in (90, 270) else (self.width, self.height)

    def keyframe_before(self, frame: int) -> int:
        """The frame number of the last keyframe at or before ``frame`` (decoding starts there)."""
        at = int(np.searchsorted(self.keyframes, frame, side="right")) - 1
        return int(self.keyframes[max(at, 0)])

    def to_json(self) -> dict[str, Any]:
        """A JSON value (the index shards carry); :meth:`from_json` reads it back."""
        return {"codec": self.codec, "width": self.width, "height": self.height, "pix_fmt": self.pix_fmt,
                "time_base": [self.time_base.numerator, self.time_base.denominator], "rotation": self.rotation,
                "pts": self.pts.tolist(), "keyframes": self.keyframes.tolist()}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        return cls(doc["codec"], int(doc["width"]), int(doc["height"]), doc["pix_fmt"], Fraction(*doc["time_base"]),
                   int(doc["rotation"]), np.asarray(doc["pts"], dtype=np.int64),
                   np.asarray(doc["keyframes"], dtype=np.int64))


def open_video(data: bytes | memoryview):
    """A PyAV container over ``data`` (read in place, no temporary file) and its first video stream."""
    try:
        import av
    except ImportError:
        raise ConfigError(f"reading videos needs PyAV: {install_extra('video')}") from None

    try:
        container = av.open(io.BytesIO(data), mode="r")
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise VideoError(f"not a readable video ({exc})") from None
    if not container.streams.video:
        container.close()
        raise VideoError("no video stream (audio only, or not a video)")
    return container, container.streams.video[0]


def probe(data: bytes | memoryview) -> VideoIndex:
    """The :class:`VideoIndex` of the video in ``data``, from its packets alone.

    Raises:
        VideoError: unreadable, no video stream, or no frame with a timestamp.
    """
    import av

    container, stream = open_video(data)
    with container:
        packets: list[tuple[int, bool]] = []
        try:
            for packet in container.demux(stream):
                if packet.size and packet.pts is not None:
                    packets.append((packet.pts, bool(packet.is_keyframe)))
        except av.error.FFmpegError as exc:
            if not packets:
                raise VideoError(f"no packet could be read ({exc})") from None
            # a file cut short: the frames before the cut are served, the rest never existed
        ctx = stream.codec_context
        codec, width, height = ctx.name, ctx.width, ctx.height
        pix_fmt = ctx.pix_fmt or ""
        time_base = Fraction(stream.time_base) if stream.time_base else Fraction(1, 90000)
        rotation = _rotation(container, stream) if packets else 0
    if not packets:
        raise VideoError("the video stream holds no frames")
    packets.sort()
    pts = np.fromiter((p for p, _ in packets), dtype=np.int64, count=len(packets))
    keys = np.flatnonzero([k for _, k in packets]).astype(np.int64)
    if not len(keys) or keys[0] != 0:
        keys = np.concatenate([[0], keys]).astype(np.int64)  # decoding starts at the first packet, key or not
    return VideoIndex(codec, width, height, pix_fmt, time_base, rotation, pts, keys)


def _rotation(container, stream) -> int:
    """Degrees counter-clockwise the frames turn for display: FFmpeg attaches the display matrix to
    each decoded frame, so the first frame is decoded (which also shows the stream decodes at all)."""
    import av

    container.seek(0, stream=stream)
    try:
        frame = next(container.decode(stream), None)
    except av.error.FFmpegError as exc:
        raise VideoError(f"the first frame does not decode ({exc})") from None
    if frame is None:
        raise VideoError("no frame decodes")
    return int(round(float(getattr(frame, "rotation", 0) or 0))) % 360 // 90 * 90
