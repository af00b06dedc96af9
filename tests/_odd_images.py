"""A class folder of the odd files real image folders hold, each named for what it is."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def _photo(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w, 1)), (y * 255 // max(h, 1)), ((x + y) * 127 // max(w + h, 1))], -1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


def write_odd_folder(root: Path) -> dict[str, Path]:
    """``root/odd/<kind>.<ext>`` plus ``root/plain/*.jpg``; returns kind -> path.

    Kinds: cmyk, gray, png_named_jpeg, progressive, rgba, palette, tiny, huge, corrupt, empty.
    """
    odd, plain = root / "odd", root / "plain"
    odd.mkdir(parents=True)
    plain.mkdir(parents=True)
    rgb = Image.fromarray(_photo(320, 240, 1))
    files = {}

    def save(kind: str, name: str, image: Image.Image, **kw) -> None:
        files[kind] = odd / name
        image.save(files[kind], **kw)

    save("cmyk", "cmyk.jpg", rgb.convert("CMYK"), format="JPEG", quality=90)
    save("gray", "gray.jpg", rgb.convert("L"), format="JPEG", quality=90)
    save("png_named_jpeg", "png_named.JPEG", rgb, format="PNG")
    save("progressive", "progressive.jpg", rgb, format="JPEG", quality=90, progressive=True)
    save("rgba", "rgba.png", rgb.convert("RGBA"), format="PNG")
    save("palette", "palette.png", rgb.convert("P"), format="PNG")
    save("tiny", "tiny.jpg", Image.fromarray(_photo(1, 1, 2)), format="JPEG")
    save("huge", "huge.jpg", Image.fromarray(_photo(2400, 1600, 3)), format="JPEG", quality=85)
    buf = io.BytesIO()
    rgb.save(buf, format="JPEG")
    files["corrupt"] = odd / "corrupt.jpg"
    files["corrupt"].write_bytes(buf.getvalue()[:200])
    files["empty"] = odd / "empty.jpg"
    files["empty"].write_bytes(b"")
    for i in range(6):
        Image.fromarray(_photo(200 + 10 * i, 150, 10 + i)).save(plain / f"{i}.jpg", quality=90)
    return files
