"""The image pipeline's per-sample augmentation and its collate.

``RandomResizedCrop`` then ``RandomHorizontalFlip``: on decoded images (:class:`Augment`, the
classic recipe) or fused with the JPEG decode (:class:`FusedAugment`, :mod:`.crop_decode`), and
from the decoded-image cache when there is one. :func:`collate` stacks the crops into uint8 batches.
"""
from __future__ import annotations

import re

import torch

from ..contract.on_corrupt import OnCorrupt
from .crop_decode import CachedCropDecode, CropDecode, stack
from .decoded_cache import DecodedCache
from .sources import CorruptImageError, corrupt, decode_bytes


class Augment:
    """``RandomResizedCrop(image_size, scale=(min_scale, 1))`` then ``RandomHorizontalFlip``, on decoded uint8."""

    def __init__(self, image_size: int, min_scale: float) -> None:
        from torchvision.transforms import v2

        self.transform = v2.Compose([v2.RandomResizedCrop(image_size, scale=(min_scale, 1.0), antialias=True),
                                     v2.RandomHorizontalFlip()])

    def __call__(self, sample):
        image, label = sample
        return self.transform(image), label


class FusedAugment:
    """The same augmentation fused with decoding (:class:`CropDecode`): ``((bytes, name), label)`` in.

    Args:
        image_size, min_scale: as :class:`Augment`. on_corrupt: ``"fail"`` or ``"skip"``
            (:func:`~.sources.corrupt`).
        dct_scaling: ``"pow2"`` or ``"none"`` (:class:`CropDecode`).
        cache, side: a :class:`DecodedCache` and the short side it keeps: crop the decoded images
            it holds instead (:class:`CachedCropDecode`).
        deferred: images may come out as :class:`~.crop_decode.Flippable` (for :func:`collate`,
            which writes them into the batch in one pass); False: always ``[3, S, S]`` tensors.
    """

    def __init__(self, image_size: int, min_scale: float, on_corrupt: OnCorrupt | str = OnCorrupt.FAIL, dct_scaling: str = "pow2",
                 cache: DecodedCache | None = None, side: int = 0, deferred: bool = False) -> None:
        self.crop_decode = CachedCropDecode(image_size, min_scale, decode_bytes, cache, side, deferred) if cache \
            else CropDecode(image_size, min_scale, decode_bytes, dct_scaling, deferred)
        self.on_corrupt = OnCorrupt.parse(on_corrupt)

    @property
    def counts(self) -> dict[str, int]:
        """Images decoded fused, decoded whole, and why (``"whole: CMYK/YCCK"``...), in this process."""
        return self.crop_decode.counts

    def __call__(self, sample):
        try:
            return self.crop_decode(sample)
        except CorruptImageError as exc:
            name = sample[0][1]  # a file's path, or "sample N of <shard>" (sources.ShardImages)
            shard = re.fullmatch(r"sample \d+ of (.+)", name, re.S)
            corrupt(exc, self.on_corrupt, shard.group(1) if shard else name)


def collate(samples) -> dict:
    """``{"image": uint8 [B, 3, S, S], "label": int64 [B]}``: 1 byte per pixel and channel on the wire."""
    return {"image": stack([s[0] for s in samples]),
            "label": torch.tensor([s[1] for s in samples], dtype=torch.int64)}
