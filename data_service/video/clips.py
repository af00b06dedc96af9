"""Which frames a clip is: ``frames_per_clip`` frames ``frame_stride`` apart from a start drawn from
the batch's generator, so a clip is a pure function of (seed, epoch, batch index) like every other
augmentation, the same on any data node and in the homogeneous mode.

A video shorter than one clip is handled by :class:`ShortVideo`: ``PAD`` repeats its last frame,
``LOOP`` starts it again, ``SKIP`` drops the sample (counted in ``samples_skipped``).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from ..errors import ConfigError, check_integer


class ShortVideo(str, enum.Enum):
    PAD = "pad"
    LOOP = "loop"
    SKIP = "skip"

    @classmethod
    def parse(cls, value: object) -> "ShortVideo":
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"short_video={value!r} must be 'pad' (repeat the last frame), 'loop' (start the "
                              "video again) or 'skip' (drop the sample, counted in samples_skipped)") from None


class TooShort(ValueError):
    """A video with fewer frames than one clip spans, under ``short_video="skip"``."""


@dataclass(frozen=True)
class ClipShape:
    """``frames`` frames, ``stride`` frames apart; ``short``: what a video shorter than that gets."""

    frames: int = 16
    stride: int = 2
    short: ShortVideo = ShortVideo.PAD

    def __post_init__(self) -> None:
        check_integer("frames_per_clip", self.frames, 1)
        check_integer("frame_stride", self.stride, 1)
        object.__setattr__(self, "short", ShortVideo.parse(self.short))

    @property
    def span(self) -> int:
        """Frames from a clip's first to its last, both included."""
        return (self.frames - 1) * self.stride + 1

    def frames_of(self, available: int, first: int = 0, last: int | None = None,
                  generator: torch.Generator | None = None) -> list[int]:
        """The frame numbers of one clip of a video of ``available`` frames, inside ``first``..``last``
        (a labelled segment; default the whole video), its start drawn uniformly with ``generator``
        (torch's global generator when None: the one the batch is seeded with).

        Raises:
            TooShort: the segment holds fewer frames than :attr:`span` and ``short`` is ``SKIP``.
        """
        last = available - 1 if last is None else min(last, available - 1)
        first = max(0, min(first, last))
        room = last - first + 1
        if room >= self.span:
            start = first + int(torch.randint(room - self.span + 1, (1,), generator=generator))
            return list(range(start, start + self.span, self.stride))
        if self.short is ShortVideo.SKIP:
            raise TooShort(f"{room} frames, fewer than a clip of {self.frames} frames at stride {self.stride} "
                           f"({self.span}); short_video='pad' or 'loop' serves it")
        steps = range(0, self.span, self.stride)
        if self.short is ShortVideo.LOOP:
            return [first + k % room for k in steps]
        return [first + min(k, room - 1) for k in steps]
