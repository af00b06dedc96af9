"""Where the image pipeline's samples come from: an image folder, or shards (``hetero prepare``'s, or
WebDataset tars indexed in place by ``hetero index``), or a Parquet data set read in place.

The folder is torchvision's ``ImageFolder`` layout (and what a SageMaker channel delivers in File
or FastFile mode)::

    root/cat/0001.jpg
    root/cat/0002.jpg
    root/dog/0001.jpg

Both sources are map-style: sample i is ``(uint8 image [3, H, W], label)``, or with
``decoded=False`` ``((encoded bytes, name), label)`` for the fused crop-and-decode. A file that does
not decode is a :class:`CorruptImageError` naming it, or with ``on_corrupt="skip"`` a
:class:`~data_service.SkipSample`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ..contract.on_corrupt import OnCorrupt
from ..contract.pipeline import SkipSample
from ..errors import ConfigError
from ..shards.checksum import CorruptSampleError
from ..shards.entries import CorruptEntryError

DAMAGED = (CorruptSampleError, CorruptEntryError)  # a sample the source refuses to hand to training

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


class CorruptImageError(ValueError):
    """A file with an image name whose bytes do not decode."""


def data_root(data_dir: str | None) -> str:
    """``data_dir``, else ``SM_CHANNEL_TRAINING``; ConfigError naming both when neither is set."""
    path = data_dir or os.environ.get("SM_CHANNEL_TRAINING", "")
    if not path:
        raise ConfigError("no image folder: SM_CHANNEL_TRAINING is unset and data_dir was not given; pass a "
                          "'training' channel laid out as root/<class>/*.jpg (or `hetero synth --images DIR`)")
    return path


def scan(root: str | os.PathLike, extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
         kind: str = "image") -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted sub-folder names) and ``(path, class index)`` of every file named with one of
    ``extensions`` (a ``kind`` of file, as errors name it: "image", "video"), sorted.

    Hidden files and folders (a leading dot) are ignored, as ``ls`` and SageMaker's S3 sync do.

    Raises:
        ConfigError: no such folder, no class folders, no such files, or a file of another kind
            (listing the first ones and the accepted extensions).
    """
    root = Path(root)
    pattern = f"root/<class>/*{extensions[0]}"
    if not root.is_dir():
        raise ConfigError(f"{kind} folder {str(root)!r}: no such directory; expected {pattern}")
    entries = sorted(e for e in root.iterdir() if not e.name.startswith("."))
    loose = [e.name for e in entries if not e.is_dir()]
    if loose:
        raise ConfigError(f"{kind} folder {str(root)!r} has files outside class folders ({_some(loose)}); {kind}s "
                          "must lie in root/<class>/ (one sub-folder per class)")
    classes = [e.name for e in entries]
    if not classes:
        raise ConfigError(f"{kind} folder {str(root)!r} is empty: expected one sub-folder per class holding "
                          f"{'/'.join(extensions)} files ({pattern})")
    samples: list[tuple[str, int]] = []
    others: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / name, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in sorted(filenames):
                if f.startswith("."):
                    continue
                (samples if f.lower().endswith(extensions) else others).append((os.path.join(dirpath, f), label))
    if others:
        raise ConfigError(f"{len(others)} file(s) in {str(root)!r} are not {kind}s by their name "
                          f"({_some([p for p, _ in others])}); accepted: {', '.join(extensions)}; "
                          "move them out of the class folders")
    if not samples:
        raise ConfigError(f"{kind} folder {str(root)!r} has class folders {_some(classes)} but no "
                          f"{'/'.join(extensions)} files in them")
    return classes, samples


def _some(names: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(str(x)) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def count_classes(data_dir: str | None = None, shards: str = "", *, index: str = "", parquet: str = "",
                  image_column: str = "image", label_column: str = "label") -> int:
    """Classes of ``shards`` (from its index, or from ``index`` when it lives elsewhere), of the
    ``parquet`` data set (its row checksums in ``index`` when not beside it), else class folders
    under ``data_dir`` (default ``SM_CHANNEL_TRAINING``)."""
    if shards or (index and not parquet):
        from ..shards.indexfile import read_index

        return len(read_index(index or shards).classes)
    if parquet:
        from ..shards.parquet import ParquetDataset

        return len(ParquetDataset(parquet, image_column=image_column, label_column=label_column, index=index).classes)
    return len(scan(data_root(data_dir))[0])


def decode(path: str) -> torch.Tensor:
    """The file as uint8 ``[3, H, W]`` RGB (torchvision's decoder: libjpeg-turbo for JPEG).

    Raises:
        CorruptImageError: the bytes do not decode (naming the file).
    """
    with open(path, "rb") as f:
        return decode_bytes(f.read(), path)


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


def corrupt(exc: CorruptImageError, on_corrupt: OnCorrupt, where: str = ""):
    """Raise what ``on_corrupt`` asks for a sample that does not decode: SkipSample (from file or shard
    ``where``), or the error with the fix."""
    if on_corrupt is OnCorrupt.SKIP:
        raise SkipSample(str(exc), where=where) from None
    raise CorruptImageError(f"{exc}; replace or remove the file, or pass pipeline.on_corrupt=skip to "
                            "drop such samples (counted in the data server's samples_skipped)") from None


class ImageFolder:
    """Map-style: sample i is (uint8 image ``[3, H, W]``, int label).

    Args:
        root: the folder (root/<class>/*.jpg). on_corrupt: ``"fail"`` or ``"skip"``.
        limit: use only the first ``limit`` images in sorted order (0 = all).
        decoded: False: sample i is ``((file bytes, path), label)``, for :class:`~.crop_decode.CropDecode`.
    """

    def __init__(self, root: str, on_corrupt: OnCorrupt | str = OnCorrupt.FAIL, limit: int = 0,
                 decoded: bool = True) -> None:
        self.root = root
        self.classes, self.samples = scan(root)
        if limit:
            self.samples = self.samples[:limit]
        self.on_corrupt = OnCorrupt.parse(on_corrupt)
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
            corrupt(exc, self.on_corrupt, path)


class ShardImages:
    """Map-style over image shards (a folder or ``s3://``) or Parquet files: (uint8 image, label).

    Args:
        shards: a :class:`data_service.shards.ShardDataset` or :class:`data_service.shards.parquet.ParquetDataset`
            (``(bytes, label)`` by index, ``location``, ``classes``). on_corrupt, limit, decoded: as
            :class:`ImageFolder`.
    """

    def __init__(self, shards, on_corrupt: OnCorrupt | str = OnCorrupt.FAIL, limit: int = 0,
                 decoded: bool = True) -> None:
        self.shards = shards
        self.decoded = decoded
        self.root = shards.location
        self.classes = shards.classes
        self.on_corrupt = OnCorrupt.parse(on_corrupt)
        self.length = min(limit, len(shards)) if limit else len(shards)

    def __len__(self) -> int:
        return self.length

    def where(self, i: int) -> str:
        """The shard or file holding sample ``i`` (the source's own answer; else the data set)."""
        where = getattr(self.shards, "where", None)
        return where(i) if where is not None else str(self.root)

    def __getitem__(self, i: int):
        try:
            data, label = self.shards[i]
        except DAMAGED as exc:  # bytes that failed their checksum twice, a shard cut short, a corrupt index
            if self.on_corrupt is OnCorrupt.SKIP:  # entry: never handed to training
                raise SkipSample(str(exc), where=self.where(i)) from None
            raise
        name = f"sample {i} of {self.where(i)}"
        if not self.decoded:
            return (data, name), label
        try:
            return decode_bytes(data, name), label
        except CorruptImageError as exc:
            corrupt(exc, self.on_corrupt, self.where(i))
