"""An image-folder training job: JPEG decode, RandomResizedCrop, flip, ResNet-18.

The layout users already have (torchvision's ``ImageFolder`` convention, and what a SageMaker
channel delivers in File or FastFile mode)::

    root/cat/0001.jpg
    root/cat/0002.jpg
    root/dog/0001.jpg

Plug-in points used by the launcher (``--hp pipeline=data_service.pipelines.images:build_pipeline``):

* ``data_service.pipelines.images:build_pipeline``: ``RandomResizedCrop(image_size)`` fused with the JPEG
  decode (only the crop is decoded, :mod:`.crop_decode`), ``RandomHorizontalFlip``; uint8
  ``[B, 3, S, S]`` on the wire (``decode="whole"``: torchvision's decoder on the whole image, then crop);
* ``data_service.pipelines.images:finish``: the device-side last stage (uint8 -> normalised float32);
* ``data_service.pipelines.images:resnet18``, ``data_service.pipelines.images:train_step``: torchvision's
  ResNet-18 (no pretrained weights) and one cross-entropy step.

Errors name the file and the fix: an empty folder, a file that is not an image (by its name), a
corrupt image (``on_corrupt="fail"`` stops the job naming the file; ``"skip"`` drops the sample,
logs the file and counts it in the data server's ``samples_skipped`` stat).
``hetero synth --images DIR`` writes a small folder of drawn shapes (:mod:`hetero.synthetic_images`).
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import Pipeline, SkipSample
from ..errors import ConfigError
from .crop_decode import DCT_SCALING, CachedCropDecode, CropDecode, stack
from .decoded_cache import DecodedCache

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
# ImageNet statistics (torchvision's pretrained-model convention), on the 0..255 scale.
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
ON_CORRUPT = ("fail", "skip")
DECODE = ("fused", "whole")
# Shard reading: a shuffle block of this many batches, and this many blocks alternating
# (docs/shards.md, "Choosing the block size").
DEFAULT_BLOCK_BATCHES = 32
DEFAULT_INTERLEAVE = 8
FINISH_DTYPES = {"image": "float32"}


class CorruptImageError(ValueError):
    """A file with an image name whose bytes do not decode."""


def data_root(data_dir: str | None) -> str:
    """``data_dir``, else ``SM_CHANNEL_TRAINING``; ConfigError naming both when neither is set."""
    path = data_dir or os.environ.get("SM_CHANNEL_TRAINING", "")
    if not path:
        raise ConfigError("no image folder: SM_CHANNEL_TRAINING is unset and data_dir was not given; pass a "
                          "'training' channel laid out as root/<class>/*.jpg (or `hetero synth --images DIR`)")
    return path


def scan(root: str | os.PathLike) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted sub-folder names) and ``(path, class index)`` of every image, sorted.

    Hidden files and folders (a leading dot) are ignored, as ``ls`` and SageMaker's S3 sync do.

    Raises:
        ConfigError: no such folder, no class folders, no images, or a file that is not an image
            (listing the first ones and the accepted extensions).
    """
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"image folder {str(root)!r}: no such directory; expected root/<class>/*.jpg")
    entries = sorted(e for e in root.iterdir() if not e.name.startswith("."))
    loose = [e.name for e in entries if not e.is_dir()]
    if loose:
        raise ConfigError(f"image folder {str(root)!r} has files outside class folders ({_some(loose)}); images "
                          "must lie in root/<class>/ (one sub-folder per class)")
    classes = [e.name for e in entries]
    if not classes:
        raise ConfigError(f"image folder {str(root)!r} is empty: expected one sub-folder per class holding "
                          f"{'/'.join(IMAGE_EXTENSIONS)} files (root/<class>/*.jpg)")
    samples, others = [], []
    for label, name in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / name, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in sorted(filenames):
                if f.startswith("."):
                    continue
                path = os.path.join(dirpath, f)
                (samples if f.lower().endswith(IMAGE_EXTENSIONS) else others).append((path, label))
    if others:
        raise ConfigError(f"{len(others)} file(s) in {str(root)!r} are not images by their name "
                          f"({_some([p for p, _ in others])}); accepted: {', '.join(IMAGE_EXTENSIONS)}; "
                          "move them out of the class folders")
    if not samples:
        raise ConfigError(f"image folder {str(root)!r} has class folders {_some(classes)} but no "
                          f"{'/'.join(IMAGE_EXTENSIONS)} files in them")
    return classes, samples


def _some(names: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(str(x)) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def decode(path: str) -> torch.Tensor:
    """The file as uint8 ``[3, H, W]`` RGB (torchvision's decoder: libjpeg-turbo for JPEG).

    Raises:
        CorruptImageError: the bytes do not decode (naming the file).
    """
    with open(path, "rb") as f:
        data = f.read()
    return decode_bytes(data, path)


def decode_bytes(data: bytes, name: str) -> torch.Tensor:
    """``data`` (an image file's bytes) as uint8 ``[3, H, W]`` RGB; ``name`` says where it came from.

    Raises:
        CorruptImageError: the bytes do not decode (naming ``name``).
    """
    from torchvision.io import ImageReadMode, decode_image

    if not data:
        raise CorruptImageError(f"{name} is empty (0 bytes)")
    try:
        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError) as exc:
        # torchvision prefixes "decode_jpeg, <source file>:<line>, ": keep the reason only
        reason = re.sub(r"^.*?\.cpp:\d+, ", "", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise CorruptImageError(f"{name} does not decode as an image ({reason})") from None


class ImageFolder:
    """Map-style: sample i is (uint8 image ``[3, H, W]``, int label).

    Args:
        root: the folder (root/<class>/*.jpg). on_corrupt: ``"fail"`` or ``"skip"``.
        limit: use only the first ``limit`` images in sorted order (0 = all).
        decoded: False: sample i is ``((file bytes, path), label)``, for :class:`CropDecode`.
    """

    def __init__(self, root: str, on_corrupt: str = "fail", limit: int = 0, decoded: bool = True) -> None:
        self.root = root
        self.classes, self.samples = scan(root)
        if limit:
            self.samples = self.samples[:limit]
        self.on_corrupt = on_corrupt
        self.decoded = decoded

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        if not self.decoded:
            with open(path, "rb") as f:
                return (f.read(), path), label
        try:
            return decode(path), label
        except CorruptImageError as exc:
            _corrupt(exc, self.on_corrupt)


class ShardImages:
    """Map-style over image shards (``hetero prepare``'s output, a folder or ``s3://``): (uint8 image, label).

    Args:
        shards: a :class:`data_service.shards.ShardDataset`. on_corrupt, limit, decoded: as :class:`ImageFolder`.
    """

    def __init__(self, shards, on_corrupt: str = "fail", limit: int = 0, decoded: bool = True) -> None:
        self.shards = shards
        self.decoded = decoded
        self.root = shards.location
        self.classes = shards.classes
        self.on_corrupt = on_corrupt
        self.length = min(limit, len(shards)) if limit else len(shards)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        data, label = self.shards[i]
        if not self.decoded:
            return (data, f"sample {i} of {self.root}"), label
        try:
            return decode_bytes(data, f"sample {i} of {self.root}"), label
        except CorruptImageError as exc:
            _corrupt(exc, self.on_corrupt)

    def prefetch(self, indices) -> None:
        self.shards.prefetch(indices)


def _corrupt(exc: CorruptImageError, on_corrupt: str):
    if on_corrupt == "skip":
        raise SkipSample(str(exc)) from None
    raise CorruptImageError(f"{exc}; replace or remove the file, or pass pipeline.on_corrupt=skip to "
                            "drop such samples (counted in the data server's samples_skipped)") from None


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
        image_size, min_scale: as :class:`Augment`. on_corrupt: as :class:`ImageFolder`.
        dct_scaling: ``"pow2"`` or ``"none"`` (:class:`CropDecode`).
        cache, side: a :class:`DecodedCache` and the short side it keeps: crop the decoded images
            it holds instead (:class:`CachedCropDecode`).
        deferred: images may come out as :class:`~.crop_decode.Flippable` (for :func:`collate`,
            which writes them into the batch in one pass); False: always ``[3, S, S]`` tensors.
    """

    def __init__(self, image_size: int, min_scale: float, on_corrupt: str = "fail", dct_scaling: str = "pow2",
                 cache: DecodedCache | None = None, side: int = 0, deferred: bool = False) -> None:
        self.crop_decode = CachedCropDecode(image_size, min_scale, decode_bytes, cache, side, deferred) if cache \
            else CropDecode(image_size, min_scale, decode_bytes, dct_scaling, deferred)
        self.on_corrupt = on_corrupt

    @property
    def counts(self) -> dict[str, int]:
        """Images decoded fused, decoded whole, and why (``"whole: CMYK/YCCK"``...), in this process."""
        return self.crop_decode.counts

    def __call__(self, sample):
        try:
            return self.crop_decode(sample)
        except CorruptImageError as exc:
            _corrupt(exc, self.on_corrupt)


def collate(samples) -> dict:
    """``{"image": uint8 [B, 3, S, S], "label": int64 [B]}``: 1 byte per pixel and channel on the wire."""
    return {"image": stack([s[0] for s in samples]),
            "label": torch.tensor([s[1] for s in samples], dtype=torch.int64)}


def finish(batch: dict) -> dict:
    """The device-side last stage: uint8 images -> float32, normalised per channel (ImageNet mean/std)."""
    out = dict(batch)
    image = batch["image"]
    scale = torch.tensor([1 / s for s in STD], dtype=torch.float32, device=image.device).view(1, 3, 1, 1)
    shift = torch.tensor([-m / s for m, s in zip(MEAN, STD)], dtype=torch.float32, device=image.device)
    # (x - mean) / std as x * (1 / std) + (-mean / std): multiplies are cheaper than divides
    out["image"] = image.to(torch.float32).mul_(scale).add_(shift.view(1, 3, 1, 1))
    return out


def collate_finished_on_server(samples) -> dict:
    """``finish_on="server"``: the same batch normalised on the data server (float32, 4x the bytes)."""
    return finish(collate(samples))


def build_pipeline(batch_size: int = 32, image_size: int = 224, min_scale: float = 0.08,
                   on_corrupt: str = "fail", limit: int = 0, data_dir: str | None = None,
                   drop_last: bool = True, finish_on: str = "device", shards: str = "",
                   shuffle_block: int = 0, interleave: int = DEFAULT_INTERLEAVE, cache_dir: str = "",
                   cache_bytes: int | str = 0, request_timeout_s: float = 60.0, decode: str = "fused",
                   dct_scaling: str = "pow2", decoded_cache_bytes: int | str = 0,
                   decoded_cache_dir: str = "/dev/shm", decoded_side: int = 0) -> Pipeline:
    """Image-folder batches ``{"image": uint8 [B, 3, image_size, image_size], "label": int64 [B]}``.

    Args:
        batch_size: images per batch (a batch with skipped samples is that many shorter).
        image_size: side of the square random crop (``RandomResizedCrop(image_size)``).
        min_scale: smallest crop area as a share of the image (torchvision's default 0.08).
        on_corrupt: ``"fail"``: a file that does not decode stops the job, naming it; ``"skip"``:
            drop that sample, log the file, count it in ``samples_skipped``.
        limit: use only the first ``limit`` images (0 = all).
        data_dir: the folder; default ``SM_CHANNEL_TRAINING`` (keep it out of the options when data
            nodes see the data at different paths: options must match on every server).
        finish_on: ``"device"``: uint8 on the wire, normalised on the training device by
            :func:`finish`; ``"server"``: normalised float32 on the wire.
        shards: read ``hetero prepare``'s shards instead of a folder: a local folder of them (a File
            or FastFile channel) or ``s3://bucket/prefix`` (read directly, cached on the data node).
        shuffle_block: with ``shards``, samples per shuffle block (each batch draws from one block;
            0 = ``DEFAULT_BLOCK_BATCHES`` batches); see docs/shards.md for what it costs in randomness.
        interleave: with ``shards``, blocks whose batches alternate (spreads work over data nodes).
        cache_dir, cache_bytes: with ``shards`` in S3, the node-local cache and its bound (a size
            such as ``"50GB"``; 0 = 80 % of the free disk space).
        request_timeout_s: with ``shards`` in S3, the deadline of one request (connect, first byte,
            each read); retries of one read stop after 8 of them.
        decode: ``"fused"``: draw the crop first and decode only that region of each JPEG
            (:mod:`data_service.pipelines.crop_decode`; PNG and odd JPEGs are decoded whole);
            ``"whole"``: decode every image whole, then crop (the classic recipe). The crop boxes,
            flips and, at full DCT scale, the pixels are the same either way.
        dct_scaling: with ``decode="fused"``, ``"pow2"`` decodes crops at least twice ``image_size``
            a side at 1/2, 1/4 or 1/8 scale; ``"none"`` keeps every crop at full scale.
        decoded_cache_bytes: keep up to this many bytes of decoded images (a size such as
            ``"20GB"``) in RAM on each data node, shared by its processes, and crop later epochs
            from them (:mod:`.decoded_cache`); 0 = off. Crops then come from images shrunk to
            short side ``decoded_side``, so batches differ from the uncached pipeline's.
        decoded_cache_dir: the tmpfs the cache lives in (a folder per pipeline is made there).
        decoded_side: short side of the images kept (0 = 1.15 x ``image_size``).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
    if isinstance(image_size, bool) or not isinstance(image_size, int) or not 8 <= image_size <= 4096:
        raise ConfigError(f"image_size={image_size!r} must be an integer in 8..4096 (pixels per side of the crop)")
    if isinstance(min_scale, bool) or not isinstance(min_scale, (int, float)) or not 0 < min_scale <= 1:
        raise ConfigError(f"min_scale={min_scale!r} must be in (0, 1]: the smallest crop area as a share of the image")
    if on_corrupt not in ON_CORRUPT:
        raise ConfigError(f"on_corrupt={on_corrupt!r} must be 'fail' (stop, naming the file) or 'skip' "
                          "(drop the sample, counted in samples_skipped)")
    if finish_on not in ("device", "server"):
        raise ConfigError(f"finish_on={finish_on!r} must be 'device' (uint8 on the wire, normalised on the "
                          "training device) or 'server' (float32 on the wire)")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigError(f"limit={limit!r} must be an integer >= 0 (0 = every image)")
    if decode not in DECODE:
        raise ConfigError(f"decode={decode!r} must be 'fused' (decode only the random crop) or 'whole' "
                          "(decode every image whole, then crop)")
    if dct_scaling not in DCT_SCALING:
        raise ConfigError(f"dct_scaling={dct_scaling!r} must be 'pow2' (large crops decoded at 1/2, 1/4 or 1/8 "
                          "scale) or 'none' (full scale)")
    fused = decode == "fused"
    from ..shards.format import parse_size

    cache_budget = parse_size(decoded_cache_bytes, "decoded_cache_bytes")
    if isinstance(decoded_side, bool) or not isinstance(decoded_side, int) or decoded_side < 0:
        raise ConfigError(f"decoded_side={decoded_side!r} must be an integer >= 0 (pixels; 0 = 1.15 x image_size)")
    side = decoded_side or round(1.15 * image_size)
    if cache_budget and side < image_size:
        raise ConfigError(f"decoded_side={decoded_side} is below image_size={image_size}: crops would be upscaled "
                          f"from smaller images; use 0 (= {round(1.15 * image_size)}) or at least {image_size}")
    if not isinstance(shards, str):
        raise ConfigError(f"shards={shards!r} must be a folder of shards or an s3://bucket/prefix")
    block = 0
    if shards:
        from ..shards import ShardDataset

        if isinstance(shuffle_block, bool) or not isinstance(shuffle_block, int) or shuffle_block < 0:
            raise ConfigError(f"shuffle_block={shuffle_block!r} must be an integer >= 0 (samples per shuffle "
                              f"block; 0 = {DEFAULT_BLOCK_BATCHES} batches)")
        block = -(-(shuffle_block or DEFAULT_BLOCK_BATCHES * batch_size) // batch_size) * batch_size
        if isinstance(request_timeout_s, bool) or not isinstance(request_timeout_s, (int, float)) \
                or request_timeout_s <= 0:
            raise ConfigError(f"request_timeout_s={request_timeout_s!r} must be a number of seconds > 0")
        dataset = ShardImages(ShardDataset(shards, block_samples=block, cache_dir=cache_dir,
                                           cache_bytes=parse_size(cache_bytes, "cache_bytes"),
                                           request_timeout_s=float(request_timeout_s)), on_corrupt, limit,
                              decoded=not fused)
    else:
        dataset = ImageFolder(data_root(data_dir), on_corrupt, limit, decoded=not fused)
    if drop_last and len(dataset) < batch_size:
        raise ConfigError(f"{dataset.root!r} holds {len(dataset)} images, fewer than batch_size={batch_size} "
                          "with drop_last=true: no batch at all; lower batch_size or add images")
    cache = None
    if cache_budget:
        import hashlib
        import json

        # one folder per pipeline (its data and image options) and host, shared by its servers' processes
        tag = hashlib.blake2b(json.dumps([shards or os.path.abspath(str(dataset.root)), limit, image_size, side],
                                         sort_keys=True).encode(), digest_size=8).hexdigest()
        cache = DecodedCache(os.path.join(decoded_cache_dir, f"hetero-decoded-{tag}"), cache_budget)
    if cache is not None and not fused:
        raise ConfigError("decoded_cache_bytes needs decode='fused' (the cache keeps the images the fused path shrinks)")
    augment = FusedAugment(image_size, float(min_scale), on_corrupt, dct_scaling, cache, side, deferred=True) if fused \
        else Augment(image_size, float(min_scale))
    hooks = {"stats": cache.stats, "close": cache.close} if cache is not None else {}
    order = {"shuffle_block": block, "interleave": interleave}
    if finish_on == "server":
        return Pipeline(dataset=dataset, batch_size=batch_size, transform=augment,
                        collate_fn=collate_finished_on_server, drop_last=drop_last, shuffle=True, **order, **hooks)
    return Pipeline(dataset=dataset, batch_size=batch_size, transform=augment, collate_fn=collate,
                    drop_last=drop_last, shuffle=True, finish=finish, finish_dtypes=FINISH_DTYPES, **order, **hooks)


# The folder is listed once when the builder runs and each file is read whole, once per epoch, and
# never written: SageMaker's FastFile mode (files streamed from S3 on first read) serves it as well
# as File mode (hetero submit --input-mode FastFile; see hetero/sagemaker/input_modes.py).
build_pipeline.input_modes = ("File", "FastFile")


def count_classes(data_dir: str | None = None, shards: str = "") -> int:
    """Classes of ``shards`` (from its index), else class folders under ``data_dir`` (default ``SM_CHANNEL_TRAINING``)."""
    if shards:
        from ..shards.format import INDEX_NAME, ShardIndex
        from ..shards.store import open_store

        store = open_store(shards)
        return len(ShardIndex.from_json(store.read(INDEX_NAME), f"{shards}/{INDEX_NAME}").classes)
    return len(scan(data_root(data_dir))[0])


def resnet18(num_classes: int = 0, data_dir: str | None = None, shards: str = "") -> nn.Module:
    """torchvision's ResNet-18, randomly initialised (no pretrained weights, no download).

    Args:
        num_classes: outputs; 0 = the number of classes of ``shards``, else of the class folders of
            ``data_dir`` / ``SM_CHANNEL_TRAINING`` (pass it explicitly on nodes that do not see the data).
    """
    from torchvision.models import resnet18 as tv_resnet18

    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
        raise ConfigError(f"num_classes={num_classes!r} must be an integer >= 1 (0 = count the class folders)")
    if num_classes == 0:
        try:
            num_classes = count_classes(data_dir, shards)
        except ConfigError as exc:
            raise ConfigError(f"resnet18: cannot count classes ({exc}); pass model.num_classes=N") from None
    return tv_resnet18(weights=None, num_classes=num_classes)


def prepare(batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised float images, labels) on ``device`` from a finished batch or a raw uint8 one."""
    images, labels = (batch["image"], batch["label"]) if isinstance(batch, dict) else batch
    images = images.to(device, non_blocking=True)
    if images.dtype == torch.uint8:
        images = finish({"image": images})["image"]
    return images, labels.to(device, non_blocking=True)


def train_step(model: nn.Module, batch, optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """One step: forward, cross-entropy, backward, optimizer step. Returns the loss."""
    images, labels = prepare(batch, device)
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate(model: nn.Module, device: torch.device, batch_size: int = 64, image_size: int = 224) -> float | None:
    """Top-1 accuracy on ``SM_CHANNEL_VALIDATION`` (same layout; centre crop); None when absent."""
    from torchvision.transforms import v2

    root = os.environ.get("SM_CHANNEL_VALIDATION", "")
    if not root or not os.path.isdir(root):
        return None
    _, samples = scan(root)
    resize = v2.Compose([v2.Resize(image_size, antialias=True), v2.CenterCrop(image_size)])
    model.eval()
    correct = 0
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        batch = {"image": torch.stack([resize(decode(p)) for p, _ in chunk]),
                 "label": torch.tensor([y for _, y in chunk], dtype=torch.int64)}
        images, labels = prepare(batch, device)
        correct += int((model(images).argmax(1) == labels).sum())
    model.train()
    return correct / len(samples)
