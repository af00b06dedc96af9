"""Clips per core: our clip decoder against a plain PyAV loop and torchcodec, on web-like videos.

The videos: photographs (``benchmarks.photos``' sources) panned across at 720p with a moving shape
and noise, x264 with a keyframe every 250 frames and 3 B-frames (``hetero.synthetic.videos``). Every
decoder gets the same clips (16 frames at stride 2 from uniform random starts, a 224-pixel crop of
the frame resized to a short side of 256), on one pinned core, with one decoder thread:

* ``ours``: ``data_service.video.ClipDecoder`` (seek to the keyframe before the clip, skip frames
  nothing references, crop + scale + convert in one swscale pass);
* ``ours, no levers``: the same decoder from the first frame, every frame decoded;
* ``pyav loop``: what a user writes with PyAV: seek, decode to the last frame, each returned frame
  converted to RGB whole, then torchvision's resize and crop;
* ``torchcodec``: ``VideoDecoder`` with its defaults, the clip's frames by ``get_frames_at``, then
  torchvision's resize and crop; and as its docs show it, ``clips_at_random_indices`` (skipped,
  saying why, where torchcodec does not load: it needs a system FFmpeg 4-9, ``apt-get install
  ffmpeg``, then ``pip install torchcodec``);
* ``sequential``: every frame of the file decoded in order, no conversion: the limit per core.

    python -m benchmarks.video --dir /tmp/bench-videos --videos 4 --clips 48
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from benchmarks.common import cli

CLIP_FRAMES, STRIDE, CROP, SHORT = 16, 2, 224, 256


def write_videos(root: Path, count: int, seconds: float, width: int, height: int, keyint: int) -> list[Path]:
    """``count`` web-like videos under ``root`` (kept when already there)."""
    from benchmarks.photos import _sources
    from hetero.synthetic.videos import write_video

    root.mkdir(parents=True, exist_ok=True)
    sources = _sources()
    out = []
    for n in range(count):
        path = root / f"web-{width}x{height}-k{keyint}-{n}.mp4"
        if not path.exists():
            name, photo = sources[n % len(sources)]
            write_video(path, frames=int(seconds * 30), width=width, height=height, keyint=keyint, bframes=3,
                        seed=n, background=_cover(photo, height + max(width, height) // 2,
                                                  width + max(width, height) // 2))
        out.append(path)
    return out


def _cover(photo: np.ndarray, height: int, width: int) -> np.ndarray:
    """``photo`` scaled to cover ``height`` x ``width`` (bilinear), as the camera's background."""
    t = torch.from_numpy(photo).permute(2, 0, 1)[None].float()
    scale = max(height / photo.shape[0], width / photo.shape[1])
    t = torch.nn.functional.interpolate(t, scale_factor=scale, mode="bilinear", align_corners=False)
    return t[0].permute(1, 2, 0).clamp(0, 255).byte().numpy()


def clip_plan(paths: list[Path], clips: int, seed: int = 0) -> list[tuple[Path, list[int], tuple[int, int]]]:
    """(video, frame numbers, crop offset in the resized frame) of each clip, the same for every decoder."""
    from data_service.video.probe import probe

    rng = np.random.default_rng(seed)
    plan = []
    for k in range(clips):
        path = paths[k % len(paths)]
        frames = probe(path.read_bytes()).frames
        start = int(rng.integers(0, frames - (CLIP_FRAMES - 1) * STRIDE))
        plan.append((path, list(range(start, start + CLIP_FRAMES * STRIDE, STRIDE)),
                     (int(rng.integers(0, 1 << 30)), int(rng.integers(0, 1 << 30)))))
    return plan


def ours(levers: bool) -> Callable:
    from data_service.video.decode import Box, ClipDecoder
    from data_service.video.probe import probe

    decoder = ClipDecoder(skip_nonref=levers, seek=levers)
    indexes: dict[Path, object] = {}

    def run(path: Path, data: bytes, frames: list[int], offset: tuple[int, int]) -> np.ndarray:
        index = indexes.get(path) or indexes.setdefault(path, probe(data))  # the index prepare stores
        w, h = index.display_size  # type: ignore[attr-defined]
        side = round(CROP * min(w, h) / SHORT)
        return decoder.clip(data, index, frames, Box(offset[0] % (h - side + 1), offset[1] % (w - side + 1),  # type: ignore[arg-type]
                                                   side, side, CROP, CROP))
    run.counts = decoder.counts  # type: ignore[attr-defined]
    return run


def _resize_crop(frames: torch.Tensor, offset: tuple[int, int]) -> torch.Tensor:
    from torchvision.transforms import v2

    frames = v2.functional.resize(frames, SHORT, antialias=True)  # [T, 3, H, W]
    h, w = frames.shape[-2:]
    return frames[..., offset[0] % (h - CROP + 1):][..., :CROP, offset[1] % (w - CROP + 1):][..., :CROP]


def pyav_loop() -> Callable:
    import io

    import av

    counts = {"decoded": 0, "returned": 0}

    def run(path: Path, data: bytes, frames: list[int], offset: tuple[int, int]) -> torch.Tensor:
        with av.open(io.BytesIO(data)) as c:
            s = c.streams.video[0]
            s.codec_context.thread_count = 1
            rate = s.average_rate
            first, last = frames[0], frames[-1]
            c.seek(int(first / rate / s.time_base), stream=s, backward=True)
            out = []
            for f in c.decode(s):
                n = round(f.pts * s.time_base * rate)
                counts["decoded"] += 1
                if n in frames:
                    out.append(torch.from_numpy(f.to_ndarray(format="rgb24")).permute(2, 0, 1))
                if n >= last:
                    break
        counts["returned"] += len(frames)
        return _resize_crop(torch.stack(out), offset)
    run.counts = counts  # type: ignore[attr-defined]
    return run


def torchcodec(sampler: bool = False) -> Callable:
    """torchcodec with its defaults (exact seek mode, one FFmpeg thread): the clip's own frames by
    ``get_frames_at``, or with ``sampler`` as its docs show it, ``clips_at_random_indices`` (its clip
    drawn from torch's global generator: the same shape of clip, not the same frames)."""
    from torchcodec.decoders import VideoDecoder
    from torchcodec.samplers import clips_at_random_indices

    def run(path: Path, data: bytes, frames: list[int], offset: tuple[int, int]) -> torch.Tensor:
        decoder = VideoDecoder(data)
        if sampler:
            torch.manual_seed(frames[0])
            clip = clips_at_random_indices(decoder, num_clips=1, num_frames_per_clip=CLIP_FRAMES,
                                           num_indices_between_frames=STRIDE).data[0]
        else:
            clip = decoder.get_frames_at(frames).data
        return _resize_crop(clip, offset)
    return run


def sequential(path: Path, data: bytes) -> int:
    import io

    import av

    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        s.codec_context.thread_count = 1
        return sum(1 for _ in c.decode(s))


def measure(name: str, fn: Callable, plan, blobs: dict[Path, bytes]) -> dict:
    fn(plan[0][0], blobs[plan[0][0]], plan[0][1], plan[0][2])  # warm: imports, first open
    counts = getattr(fn, "counts", None)
    if counts is not None:
        for k in ("decoded", "returned"):
            if isinstance(counts, dict):
                counts[k] = 0
            else:
                setattr(counts, k, 0)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for path, frames, offset in plan:
        fn(path, blobs[path], frames, offset)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    row = {"decoder": name, "clips": len(plan), "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
           "clips_per_core_s": round(len(plan) / cpu, 2), "frames_per_core_s": round(len(plan) * CLIP_FRAMES / cpu, 1)}
    if counts is not None:
        decoded = counts["decoded"] if isinstance(counts, dict) else counts.decoded
        returned = counts["returned"] if isinstance(counts, dict) else counts.returned
        row["decoded_per_returned"] = round(decoded / max(1, returned), 2)
    return row


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench-videos"), help="where the videos are kept")
    ap.add_argument("--videos", type=int, default=4, help="videos generated")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each video")
    ap.add_argument("--size", default="1280x720", help="WxH of the videos")
    ap.add_argument("--keyint", type=int, default=250, help="frames from one keyframe to the next")
    ap.add_argument("--clips", type=int, default=48, help="clips each decoder decodes")
    ap.add_argument("--core", type=int, default=None, help="the CPU to pin to (default: the last usable)")
    cli.add_json(ap)
    args = ap.parse_args()
    core = args.core if args.core is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    width, height = (int(v) for v in args.size.split("x"))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    paths = write_videos(args.dir, args.videos, args.seconds, width, height, args.keyint)
    blobs = {p: p.read_bytes() for p in paths}
    plan = clip_plan(paths, args.clips)
    rows = [measure("ours", ours(True), plan, blobs), measure("ours, no levers", ours(False), plan, blobs),
            measure("pyav loop", pyav_loop(), plan, blobs)]
    for name, sampler in (("torchcodec", False), ("torchcodec, its sampler", True)):
        try:
            rows.append(measure(name, torchcodec(sampler), plan, blobs))
        except Exception as exc:  # not installed, or its FFmpeg libraries missing: say so, keep the others
            rows.append({"decoder": name, "skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"})
    cpu0 = time.process_time()
    frames = sum(sequential(p, blobs[p]) for p in paths)
    limit = frames / (time.process_time() - cpu0)
    print(f"# {started}: {len(paths)} videos {args.size}, keyframe every {args.keyint}, {args.seconds:.0f} s each; "
          f"{args.clips} clips of {CLIP_FRAMES} frames at stride {STRIDE}, crop {CROP} of short side {SHORT}; core {core}")
    print(f"sequential decode (the limit): {limit:.1f} frames per core-second")
    print("| decoder | clips/core-s | frames/core-s | decoded per returned | vs ours |")
    print("|---|---|---|---|---|")
    base = rows[0]["clips_per_core_s"]
    for r in rows:
        if "skipped" in r:
            print(f"| {r['decoder']} | skipped: {r['skipped']} | | | |")
            continue
        print(f"| {r['decoder']} | {r['clips_per_core_s']} | {r['frames_per_core_s']} | "
              f"{r.get('decoded_per_returned', 'n/a')} | {base / r['clips_per_core_s']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps({"started": started, "args": {k: str(v) for k, v in vars(args).items()},
                                               "sequential_frames_per_core_s": limit, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
