"""Web-like videos for tests, benchmarks and the video quickstart (no download).

Flat colours decode far faster than real footage, so every frame here has what makes a web video
cost its decoder: a textured background (octaves of smooth noise, or a photograph the caller passes)
that the camera pans across, a moving shape (the class, as in :mod:`.images`), and sensor noise; x264
at a web-like keyframe interval (250 frames) with B-frames.

``write_video(path, ...)`` writes one file; ``write_video_folder(root)`` writes
``root/<shape>/<n>.mp4`` in a few resolutions (``hetero synth --videos DIR``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from data_service.errors import ConfigError

from .images import SHAPES, _mask

if TYPE_CHECKING:
    from av.video.stream import VideoStream

SIZES = ((320, 240), (640, 360), (480, 270))


def texture(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A uint8 ``[height, width, 3]`` photo-like texture: octaves of bilinearly upsampled noise."""
    out = np.zeros((height, width, 3), np.float32)
    for octave, weight in ((4, 0.45), (16, 0.3), (64, 0.15), (256, 0.1)):
        cells = rng.uniform(0, 255, (max(2, height * octave // 1024 + 2), max(2, width * octave // 1024 + 2), 3))
        ys = np.linspace(0, cells.shape[0] - 1.001, height)
        xs = np.linspace(0, cells.shape[1] - 1.001, width)
        y0, x0 = ys.astype(int), xs.astype(int)
        fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
        c = cells.astype(np.float32)
        top = c[y0][:, x0] * (1 - fx) + c[y0][:, x0 + 1] * fx
        bottom = c[y0 + 1][:, x0] * (1 - fx) + c[y0 + 1][:, x0 + 1] * fx
        out += weight * (top * (1 - fy) + bottom * fy)
    return np.clip(out, 0, 255).astype(np.uint8)


def write_video(path: str | os.PathLike, *, frames: int = 300, width: int = 640, height: int = 360, fps: int = 30,
                keyint: int = 250, bframes: int = 3, shape: str = "circle", seed: int = 0, crf: int = 23,
                codec: str = "libx264", pix_fmt: str = "yuv420p", rotation: int = 0, preset: str = "veryfast",
                background: np.ndarray | None = None, container: str | None = None) -> Path:
    """One video of ``frames`` frames: the camera pans over ``background`` (a texture when None) while
    ``shape`` moves across it, with noise; ``codec`` at a keyframe every ``keyint`` frames.

    Args:
        rotation: display rotation written into the file (degrees counter-clockwise; a phone's).
        container: the format name (default from the file's suffix).
    """
    import av

    if shape not in SHAPES:
        raise ConfigError(f"shape {shape!r} is not one of {SHAPES}")
    rng = np.random.default_rng(seed)
    margin = max(width, height) // 2
    bg = background if background is not None else texture(height + margin, width + margin, rng)
    bg = _fit(bg, height + margin, width + margin)
    mask = _mask(shape, height // 2, width // 2, rng)
    colour = rng.uniform(0, 255, 3).astype(np.float32)
    path = Path(path)
    options = {"preset": preset, "crf": str(crf), "threads": "1"}
    if codec == "libx264":
        options["x264-params"] = f"keyint={keyint}:min-keyint={keyint}:scenecut=0:bframes={bframes}"
    elif codec == "libx265":
        options["x265-params"] = f"keyint={keyint}:min-keyint={keyint}:scenecut=0:bframes={bframes}:log-level=error"
    else:
        options["g"] = str(keyint)
    with av.open(str(path), "w", format=container) as out:
        stream = cast("VideoStream", out.add_stream(codec, rate=fps, options=options))  # a video codec's stream
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if rotation:
            stream.set_display_rotation(rotation)
        for i in range(frames):
            t = i / max(1, frames - 1)
            y, x = int(margin * t), int(margin * (0.5 + 0.5 * np.sin(6.28 * t)))  # the camera pans
            frame = bg[y:y + height, x:x + width].astype(np.float32)
            sy, sx = int((height // 2) * t), int((width // 2) * (1 - t))  # the shape moves the other way
            region = frame[sy:sy + height // 2, sx:sx + width // 2]
            region[mask[:region.shape[0], :region.shape[1]]] = colour
            frame += rng.normal(0, 4, frame.shape).astype(np.float32)  # sensor noise
            image = av.VideoFrame.from_ndarray(np.clip(frame, 0, 255).astype(np.uint8), format="rgb24")
            for packet in stream.encode(image):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def write_video_folder(root: str | os.PathLike, per_class: int = 4, classes: int = 3, frames: int = 120,
                       sizes: tuple[tuple[int, int], ...] = SIZES, keyint: int = 250, seed: int = 0) -> int:
    """``root/<shape>/<n>.mp4``: ``per_class`` videos of each of the first ``classes`` shapes, cycling
    through ``sizes``; returns the number written (kept files are not written again)."""
    if not 1 <= classes <= len(SHAPES):
        raise ConfigError(f"classes={classes} must be in 1..{len(SHAPES)}")
    written = 0
    for c, shape in enumerate(SHAPES[:classes]):
        folder = Path(root) / shape
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(per_class):
            path = folder / f"{n:04d}.mp4"
            if path.exists():
                continue
            width, height = sizes[(c * per_class + n) % len(sizes)]
            write_video(path, frames=frames, width=width, height=height, keyint=keyint, shape=shape,
                        seed=seed * 100_003 + c * 1009 + n)
            written += 1
    return written


def _fit(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` tiled (mirrored) up to at least ``height`` x ``width``, then cut to it."""
    reps = (-(-height // image.shape[0]), -(-width // image.shape[1]), 1)
    if reps[:2] != (1, 1):
        image = np.tile(image, reps)
    return np.ascontiguousarray(image[:height, :width, :3])
