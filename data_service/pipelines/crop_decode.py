"""Fused random crop and decode: decode only the region ``RandomResizedCrop`` keeps.

The classic recipe decodes the whole JPEG, then crops and resizes: on ImageNet-sized photos about
half the time per image is spent outside the decoder, and much of the decoder's is spent on pixels
the crop throws away. :class:`CropDecode` draws the crop box first, from the JPEG's header and
exactly as ``torchvision.transforms.v2.RandomResizedCrop`` draws it (the same random calls, so the
same box for the same seed), then asks libjpeg-turbo for that region only (``jpeg_crop_scanline``,
``jpeg_skip_scanlines``: what tf.data's ``decode_and_crop_jpeg`` does), optionally at a reduced DCT
scale (``dct_scaling``: the smallest of 1/8, 1/4, 1/2, 1 that still leaves at least the output size),
then resizes with antialiasing and flips exactly as the classic recipe does.

At full scale the output is bit-identical to decoding the whole image with torchvision and
applying ``v2.RandomResizedCrop`` + ``v2.RandomHorizontalFlip``. PNGs, CMYK/YCCK, 12-bit and
arithmetic-coded JPEGs, files with corrupt data, and everything when the compiled part is missing
are decoded whole by torchvision as before and counted in :attr:`CropDecode.counts`.
"""
from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import torch

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # calls checked against _jpegcrop.pyi; None where not built, checked before every call
    from . import _jpegcrop
else:
    try:
        from . import _jpegcrop
    except ImportError:  # built at install time when a C compiler and libjpeg-turbo's headers exist
        _jpegcrop = None

RATIO = (3.0 / 4.0, 4.0 / 3.0)


def available() -> bool:
    """True when the compiled crop decoder is installed (else every image is decoded whole)."""
    return _jpegcrop is not None


class BoxDraw:
    """``v2.RandomResizedCrop.make_params``' draw of ``(top, left, h, w)``, call for call on torch's RNG.

    The same generator calls on the same dtypes as torchvision (uniform_ on float32, exp in float32,
    random_ on int64 as ``torch.randint`` does), into buffers allocated once: a third of the time.
    """

    def __init__(self, scale: tuple[float, float], ratio: tuple[float, float] = RATIO) -> None:
        self.scale, self.ratio = scale, ratio
        self._log_ratio = tuple(torch.log(torch.tensor(ratio)).tolist())
        self._area = torch.empty(1)
        self._aspect = torch.empty(1)
        self._offset = torch.empty(1, dtype=torch.int64)

    def __call__(self, height: int, width: int) -> tuple[int, int, int, int]:
        area = height * width
        for _ in range(10):
            target_area = area * self._area.uniform_(self.scale[0], self.scale[1]).item()
            aspect_ratio = torch.exp(self._aspect.uniform_(*self._log_ratio)).item()
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                i = self._offset.random_(0, height - h + 1).item()
                j = self._offset.random_(0, width - w + 1).item()
                return i, j, h, w  # type: ignore[return-value]  # torch's stubs: an int64 tensor's item() is an int
        in_ratio = float(width) / float(height)
        if in_ratio < min(self.ratio):
            w = width
            h = int(round(w / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h = height
            w = int(round(h * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w


def dct_scale(h: int, w: int, size: int) -> int:
    """``m`` of the smallest DCT scale ``m/8`` in 1/8, 1/4, 1/2, 1 that leaves the box at least ``size`` a side.

    Only powers of two: libjpeg-turbo's other scaled IDCTs have no SIMD code and cost more than
    the resize they save (docs/benchmarks.md, "Fused crop and decode").
    """
    side = min(h, w)
    m = 8
    while m > 1 and side * (m // 2) >= 8 * size:
        m //= 2
    return m


class CropDecode:
    """``(encoded image bytes, label) -> (uint8 [3, size, size], label)``: crop, decode, resize, flip.

    Args:
        size: side of the output square. min_scale: smallest crop area as a share of the image.
        decode_whole: ``decode_whole(data, name) -> uint8 [3, H, W]``, the full decoder (and its
            errors) for what the fused path does not take.
        dct_scaling: ``"pow2"``: a box at least twice the output a side is decoded at 1/2, 1/4
            or 1/8 scale (libjpeg's scaled IDCT, itself a good low-pass filter); ``"none"``:
            always full scale, bit-identical to the whole-image path.
        deferred: return fused outputs as :class:`Flippable` (the flip left to :func:`stack`,
            which writes them straight into the batch) instead of a tensor.
    """

    def __init__(self, size: int, min_scale: float, decode_whole, dct_scaling: str = "pow2",
                 deferred: bool = False) -> None:
        from torchvision.transforms import v2

        self.size = size
        self.scale = (min_scale, 1.0)
        self.decode_whole = decode_whole
        self.dct_scaling = dct_scaling
        self.draw_box = BoxDraw(self.scale)
        self._crop = v2.RandomResizedCrop(size, scale=self.scale, antialias=True)  # the fallback, same draws
        self.deferred = deferred
        self.counts = {"fused": 0, "whole": 0}

    def __call__(self, sample):
        (data, name), label = sample
        box, image, why = self._fused(data) if _jpegcrop is not None else (None, None, "not built")
        if image is None:
            self.counts["whole"] += 1
            key = f"whole: {why}"
            self.counts[key] = self.counts.get(key, 0) + 1
            if self.counts[key] == 1:  # once per reason and process
                if why == "not built":
                    log.warning("fused crop-and-decode is not installed (building it needs a C compiler and "
                                "libjpeg-turbo's headers: apt-get install gcc libjpeg-dev, then reinstall the "
                                "package); decoding whole images")
                else:
                    log.info("%s: decoded whole (%s); further such images are counted, not logged", name, why)
            whole = self.decode_whole(data, name)
            if box is None:
                image = self._crop(whole)
            else:  # the box is drawn already: the same one, so the same pixels as the classic recipe
                image = _resize(whole[:, box[0]:box[0] + box[2], box[1]:box[1] + box[3]], self.size)
            if torch.rand(1) < 0.5:  # v2.RandomHorizontalFlip(p=0.5)'s draw
                image = image.flip(-1)
            return image, label
        self.counts["fused"] += 1
        return _finish(image, torch.rand(1).item() < 0.5, self.deferred), label

    def _fused(self, data: bytes):
        """(the box drawn or None, the output or None, why not fused)."""
        size, why = plain_jpeg_size(data)
        if size is None:
            return None, None, why
        width, height = size
        box = self.draw_box(height, width)
        top, left, h, w = box
        m = dct_scale(h, w, self.size) if self.dct_scaling == "pow2" else 8
        try:
            out = _jpegcrop.decode_crop(data, left, top, w, h, m)
        except ValueError:
            out = None
        if out is None:
            return box, None, "corrupt data"
        return box, _resize_hwc(_hwc(out), self.size), ""


def plain_jpeg_size(data: bytes) -> tuple[tuple[int, int] | None, str]:
    """``((width, height), "")`` for a JPEG the crop decoder takes, else ``(None, why not)``."""
    if data[:2] != b"\xff\xd8":
        return None, "not a JPEG"
    if b"\xff\xd9" not in data[-1024:]:
        return None, "truncated"  # rows past the crop are never read: let the whole decoder judge
    try:
        width, height, components, space, _progressive, precision, arith = _jpegcrop.info(data)
    except ValueError:
        return None, "bad header"
    if precision != 8:
        return None, f"{precision}-bit"
    if arith:
        return None, "arithmetic-coded"
    if components not in (1, 3) or space not in (_jpegcrop.JCS_YCbCr, _jpegcrop.JCS_GRAYSCALE, _jpegcrop.JCS_RGB):
        return None, "CMYK/YCCK"
    return (width, height), ""


def _hwc(out: tuple[bytearray, int, int]) -> torch.Tensor:
    buf, rows, cols = out
    return torch.frombuffer(buf, dtype=torch.uint8).view(rows, cols, 3)


class CachedCropDecode:
    """:class:`CropDecode`'s job from decoded images kept in a :class:`~.decoded_cache.DecodedCache`.

    Each image is decoded once (at the smallest DCT scale that keeps its short side at least
    ``side``), shrunk to short side ``side`` (antialiased), stored, and every epoch cropped, resized
    and flipped from the stored copy (the same draws as :class:`CropDecode`).

    Args:
        size, min_scale, decode_whole, deferred: as :class:`CropDecode`. cache: the store. side: short
            side kept.
    """

    def __init__(self, size: int, min_scale: float, decode_whole, cache, side: int, deferred: bool = False) -> None:
        self.size, self.side = size, side
        self.deferred = deferred
        self.decode_whole = decode_whole
        self.cache = cache
        self.draw_box = BoxDraw((min_scale, 1.0))
        self.counts = {"cache hit": 0, "cache miss": 0}

    def __call__(self, sample):
        (data, name), label = sample
        key = self.cache.key(data)
        image = self.cache.get(key)
        if image is None:
            self.counts["cache miss"] += 1
            image = self.shrunk(data, name)
            self.cache.put(key, image)
        else:
            self.counts["cache hit"] += 1
        top, left, h, w = self.draw_box(image.shape[0], image.shape[1])
        out = _resize_hwc(image[top:top + h, left:left + w], self.size)
        return _finish(out, torch.rand(1).item() < 0.5, self.deferred), label

    def shrunk(self, data: bytes, name: str) -> torch.Tensor:
        """The image decoded and shrunk to short side ``side`` (if longer), uint8 ``[rows, cols, 3]``."""
        image = None
        if _jpegcrop is not None:
            size, _ = plain_jpeg_size(data)
            if size is not None:
                width, height = size
                try:
                    out = _jpegcrop.decode_crop(data, 0, 0, width, height, dct_scale(height, width, self.side))
                except ValueError:
                    out = None
                image = _hwc(out) if out is not None else None
        if image is None:
            image = self.decode_whole(data, name).permute(1, 2, 0)
        rows, cols = image.shape[:2]
        if min(rows, cols) > self.side:
            scale = self.side / min(rows, cols)
            shape = (max(1, round(rows * scale)), max(1, round(cols * scale)))
            image = torch.nn.functional.interpolate(image.permute(2, 0, 1).unsqueeze(0), size=shape, mode="bilinear",
                                                    antialias=True, align_corners=False)[0].permute(1, 2, 0)
        return image.contiguous()


class Flippable:
    """A fused output whose horizontal flip is not applied yet: uint8 ``[3, size, size]`` + ``flip``.

    :func:`stack` writes it into the batch, mirrored if ``flip``, in one pass over its bytes;
    :meth:`tensor` gives the final ``[3, size, size]`` tensor on its own.
    """

    __slots__ = ("image", "flip")

    def __init__(self, image: torch.Tensor, flip: bool) -> None:
        self.image, self.flip = image, flip

    @property
    def shape(self) -> torch.Size:
        return self.image.shape

    def tensor(self) -> torch.Tensor:
        return self.image.flip(-1) if self.flip else self.image

    def write(self, out: torch.Tensor) -> None:
        if _jpegcrop is None:  # cached crops are deferred on hosts without the compiled part too
            out.copy_(self.tensor())
            return
        c, h, w = self.image.shape
        _jpegcrop.copy_rows(self.image.numpy(), c * h, w, self.flip, out.numpy())


def stack(images: list) -> torch.Tensor:
    """``torch.stack`` of ``[3, S, S]`` images that also takes :class:`Flippable` ones (written in place)."""
    if not any(isinstance(x, Flippable) for x in images):
        return torch.stack(images)
    out = torch.empty(len(images), *images[0].shape, dtype=torch.uint8)
    for i, x in enumerate(images):
        if isinstance(x, Flippable):
            x.write(out[i])
        else:
            out[i].copy_(x)
    return out


def _finish(image: torch.Tensor, flip: bool, deferred: bool):
    image = image.contiguous()  # itself when it is already
    return Flippable(image, flip) if deferred else (image.flip(-1) if flip else image)


def _resize_hwc(region: torch.Tensor, size: int) -> torch.Tensor:
    """``region`` (uint8 ``[rows, cols, 3]``, any strides) resized to ``[3, size, size]``."""
    return _resize(region.permute(2, 0, 1), size)


def _resize(region: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear, antialiased, uint8: ``v2.functional.resize``'s kernel without its per-call overhead."""
    return torch.nn.functional.interpolate(region.unsqueeze(0), size=(size, size), mode="bilinear",
                                           antialias=True, align_corners=False)[0]
