"""The video pipeline's options as one typed, checked value: :class:`VideoOptions`.

Every option is checked when the object is made; a bad one is a ConfigError that names the value
and what it must be. The clip's shape is a :class:`~data_service.video.clips.ClipShape`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..contract.on_corrupt import OnCorrupt
from ..errors import ConfigError, check_integer
from ..video.clips import ClipShape, ShortVideo

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".mov", ".avi")
CROP = {"random": "short side resized to short_side, then a random image_size square",
        "center": "short side resized to short_side, then the centre image_size square",
        "random-resized": "RandomResizedCrop(image_size, scale=(min_scale, 1)), as the image pipeline"}
LAYOUT = {"BCTHW": "[B, 3, T, H, W], what torchvision's video models take", "BTCHW": "[B, T, 3, H, W]"}
LEVERS = {"all": "seek to the keyframe before the clip, skip frames nothing references",
          "seek": "seek only", "none": "decode from the first frame, every frame (a baseline)"}


@dataclass(frozen=True)
class VideoOptions:
    """``build_pipeline``'s options (documented there), checked; ``clip`` (a ClipShape) derived.

    Raises:
        ConfigError: an option of the wrong type or out of range.
    """

    batch_size: int = 8
    frames_per_clip: int = 16
    frame_stride: int = 2
    clips_per_video: int = 1
    short_video: ShortVideo = ShortVideo.PAD
    image_size: int = 224
    short_side: int = 0
    crop: str = "random"
    min_scale: float = 0.08
    flip: bool = True
    on_corrupt: OnCorrupt = OnCorrupt.FAIL
    limit: int = 0
    data_dir: str | None = None
    drop_last: bool = True
    layout: str = "BCTHW"
    levers: str = "all"
    clip: ClipShape = field(init=False, repr=False)
    side: int = field(init=False, repr=False)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "VideoOptions":
        """The options from keyword arguments; an unknown name is a ConfigError listing the known ones."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown video pipeline option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**kwargs)

    def __post_init__(self) -> None:
        check_integer("batch_size", self.batch_size, 1)
        check_integer("clips_per_video", self.clips_per_video, 1, hint=" (clips drawn from each video an epoch)")
        check_integer("image_size", self.image_size, 8, 4096, " (pixels per side of the crop)")
        check_integer("short_side", self.short_side, 0, 8192, " (pixels; 0 = 1.15 x image_size)")
        check_integer("limit", self.limit, 0, hint=" (0 = every video)")
        if isinstance(self.min_scale, bool) or not isinstance(self.min_scale, (int, float)) \
                or not 0 < self.min_scale <= 1:
            raise ConfigError(f"min_scale={self.min_scale!r} must be in (0, 1]: the smallest crop area as a share "
                              "of the frame")
        for name, value, choices in (("crop", self.crop, CROP), ("layout", self.layout, LAYOUT),
                                     ("levers", self.levers, LEVERS)):
            if value not in choices:
                raise ConfigError(f"{name}={value!r} must be " + " or ".join(f"{k!r} ({why})"
                                                                          for k, why in choices.items()))
        for name in ("flip", "drop_last"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be true or false")
        if self.data_dir is not None and (not isinstance(self.data_dir, str) or not self.data_dir):
            raise ConfigError(f"data_dir={self.data_dir!r} must be a folder laid out as root/<class>/*.mp4 (or "
                              "unset: SM_CHANNEL_TRAINING)")
        object.__setattr__(self, "on_corrupt", OnCorrupt.parse(self.on_corrupt))
        object.__setattr__(self, "short_video", ShortVideo.parse(self.short_video))
        object.__setattr__(self, "clip", ClipShape(self.frames_per_clip, self.frame_stride, self.short_video))
        object.__setattr__(self, "side", self.short_side or round(1.15 * self.image_size))
        if self.side < self.image_size:
            raise ConfigError(f"short_side={self.short_side} is below image_size={self.image_size}: the crop would "
                              f"not fit; use 0 (= {round(1.15 * self.image_size)}) or at least {self.image_size}")
