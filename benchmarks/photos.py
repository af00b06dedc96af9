"""Photo-like JPEG folders for decode and I/O figures, cut from scikit-image's real photographs.

Drawn shapes (``hetero synth --images``) compress far better than photographs and decode
unrealistically fast. These images are random crops of the photographs scikit-image ships (no
download), resized to ImageNet's size mix (long side 500 px for most, 250-500 for the rest; 4:3,
3:2, 1:1 and 3:4 frames), lightly jittered so no two files are the same, and saved as JPEG
quality 90: about 170 k pixels and 40-60 KiB a file. One class per source photograph.
Without scikit-image, 9 of the 10 photographs come from ``benchmarks/photo_sources`` (see its README).

    python -m benchmarks.photos DIR --images 10000
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from benchmarks.common import cli

SOURCES = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina",
           "stereo_motorcycle", "camera", "grass")
FRAMES = ((4 / 3, 0.5), (3 / 2, 0.2), (1.0, 0.1), (3 / 4, 0.2))  # width / height, share


BUNDLED = Path(__file__).resolve().parent / "photo_sources"  # 9 of SOURCES, for machines without scikit-image


def photo_sources() -> str:
    """Where the source photographs come from here: ``"scikit-image"``, else ``"bundled"``
    (``benchmarks/photo_sources``: 9 of the 10, without ``stereo_motorcycle``)."""
    try:
        import skimage.data  # noqa: F401
        return "scikit-image"
    except ImportError:
        return "bundled"


def _sources() -> list[tuple[str, np.ndarray]]:
    """(name, RGB uint8 image) of every source photograph."""
    out = []
    if photo_sources() == "bundled":
        from PIL import Image

        for name in SOURCES:
            if (BUNDLED / f"{name}.jpg").exists():
                out.append((name, np.asarray(Image.open(BUNDLED / f"{name}.jpg").convert("RGB"))))
        return out
    import skimage.data as data

    for name in SOURCES:
        image = getattr(data, name)()
        image = image[0] if isinstance(image, tuple) else image
        if image.ndim == 2:
            image = np.stack([image] * 3, -1)
        out.append((name, np.ascontiguousarray(image[..., :3])))
    return out


def write_photo_folder(root: str | os.PathLike, count: int, seed: int = 0) -> int:
    """Write ``count`` JPEGs as ``root/<source>/<n>.jpg`` (kept if already there); returns the count written."""
    from PIL import Image

    root = Path(root)
    existing = sum(1 for _ in root.glob("*/*.jpg")) if root.exists() else 0
    if existing >= count:
        return 0
    sources = _sources()
    rng = np.random.default_rng(seed)
    shares = np.array([s for _, s in FRAMES])
    written = 0
    for n in range(count):
        name, src = sources[n % len(sources)]
        path = root / name / f"{n:07d}.jpg"
        if path.exists():
            continue
        h, w = src.shape[:2]
        area = rng.uniform(0.3, 1.0) * h * w
        ratio = FRAMES[rng.choice(len(FRAMES), p=shares / shares.sum())][0]
        cw = int(min(w, np.sqrt(area * ratio)))
        ch = int(min(h, cw / ratio))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = src[y:y + ch, x:x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        crop = np.clip(crop.astype(np.float32) * rng.uniform(0.85, 1.15, 3) + rng.normal(0, 3, crop.shape),
                       0, 255).astype(np.uint8)
        long_side = 500 if rng.random() < 0.75 else int(rng.integers(250, 501))
        scale = long_side / max(cw, ch)
        size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(crop).resize(size, Image.BILINEAR).save(path, quality=90)
        written += 1
    return written


def photo_files(root: str | os.PathLike, count: int) -> list[str]:
    """The first ``count`` JPEGs of ``root/<class>/*.jpg`` (sorted); ends the run, saying how to
    write more, when it holds fewer."""
    files = sorted(str(p) for p in Path(root).glob("*/*.jpg"))[:count]
    if len(files) < count:
        raise SystemExit(f"{root} holds {len(files)} JPEGs, fewer than --images {count}; "
                         f"python -m benchmarks.photos {root} --images {count}")
    return files


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("root")
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t = time.monotonic()
    n = write_photo_folder(args.root, args.images, args.seed)
    files = list(Path(args.root).glob("*/*.jpg"))
    size = sum(f.stat().st_size for f in files)
    print(f"{n} written ({photo_sources()} source photographs), {len(files)} JPEGs in {args.root}, "
          f"{size / len(files) / 1024:.1f} KiB each on average, {time.monotonic() - t:.1f}s")


if __name__ == "__main__":
    main()
