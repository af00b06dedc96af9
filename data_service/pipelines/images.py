"""The image pipeline: JPEG decode, RandomResizedCrop, flip; from an image folder, image shards or Parquet files.

Plug-in points used by the launcher (``--hp pipeline=data_service.pipelines.images:build_pipeline``):

* ``data_service.pipelines.images:build_pipeline``: ``RandomResizedCrop(image_size)`` fused with the JPEG
  decode (only the crop is decoded, :mod:`.crop_decode`), ``RandomHorizontalFlip``; uint8
  ``[B, 3, S, S]`` on the wire (``decode="whole"``: torchvision's decoder on the whole image, then crop);
* ``data_service.pipelines.images:finish``: the device-side last stage (uint8 -> normalised float32).

The parts: :mod:`.sources` (the folder and the shards), :mod:`.augment` (crop, flip, collate),
:mod:`.image_options` (the options, checked). A model to train on it (ResNet-18, its step and
evaluation) is user code: ``examples.imagefolder``.

Errors name the file and the fix: an empty folder, a file that is not an image (by its name), a
corrupt image (``on_corrupt="fail"`` stops the job naming the file; ``"skip"`` drops the sample,
logs the file and counts it in the data server's ``samples_skipped`` stat).
``hetero synth --images DIR`` writes a small folder of drawn shapes (:mod:`hetero.synthetic.images`).
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import fields
from typing import Any

import torch

from ..contract.pipeline import Pipeline, ServerSide
from ..errors import ConfigError
from ..storage.parsing import is_s3_url
from .augment import Augment, FusedAugment, collate
from .decoded_cache import MAGIC as ENTRY_FORMAT, DecodedCache
from .image_options import DEFAULT_BLOCK_BATCHES, DEFAULT_INTERLEAVE, ImageOptions
from .sources import (IMAGE_EXTENSIONS, CorruptImageError, ImageFolder, ShardImages, count_classes, data_root,
                      decode, decode_bytes, scan)

__all__ = ["DEFAULT_BLOCK_BATCHES", "DEFAULT_INTERLEAVE", "FINISH_DTYPES", "IMAGE_EXTENSIONS", "MEAN", "STD",
           "Augment", "CorruptImageError", "FusedAugment", "ImageFolder", "ImageOptions", "ShardImages",
           "build_pipeline", "collate", "collate_finished_on_server", "count_classes", "data_root", "decode",
           "decode_bytes", "finish", "scan"]

# ImageNet statistics (torchvision's pretrained-model convention), on the 0..255 scale.
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
FINISH_DTYPES = {"image": "float32"}


def finish(batch: dict) -> dict:
    """The device-side last stage: uint8 images -> float32, normalised per channel (ImageNet mean/std)."""
    image = batch["image"]
    scale = torch.tensor([1 / s for s in STD], dtype=torch.float32, device=image.device).view(1, 3, 1, 1)
    shift = torch.tensor([-m / s for m, s in zip(MEAN, STD)], dtype=torch.float32, device=image.device)
    # (x - mean) / std as x * (1 / std) + (-mean / std): multiplies are cheaper than divides
    return {**batch, "image": image.to(torch.float32).mul_(scale).add_(shift.view(1, 3, 1, 1))}


def collate_finished_on_server(samples) -> dict:
    """``finish_on="server"``: the same batch normalised on the data server (float32, 4x the bytes)."""
    return finish(collate(samples))


def build_pipeline(**options) -> Pipeline:
    """Image batches ``{"image": uint8 [B, 3, image_size, image_size], "label": int64 [B]}``.

    Args:
        batch_size: images per batch (a batch with skipped samples is that many shorter); 32.
        image_size: side of the square random crop (``RandomResizedCrop(image_size)``); 224.
        min_scale: smallest crop area as a share of the image (torchvision's default 0.08).
        on_corrupt: ``"fail"``: a file that does not decode stops the job, naming it; ``"skip"``:
            drop that sample, log the file, count it in ``samples_skipped``.
        limit: use only the first ``limit`` images (0 = all).
        data_dir: the folder; default ``SM_CHANNEL_TRAINING`` (keep it out of the options when data
            nodes see the data at different paths: options must match on every server).
        drop_last: leave out the last, short batch (True).
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
        index: with ``shards``, where their ``index.bin`` lives when not beside them (``hetero index
            SRC --to DEST`` for tars in a read-only place: ``shards=SRC``, ``index=DEST``); with
            ``parquet``, where the row checksums ``hetero index SRC --to DEST`` wrote live.
        parquet: read a Parquet data set in place instead (a file, or a folder or ``s3://`` prefix of
            ``.parquet`` files; :mod:`data_service.shards.parquet`), a shuffle block per run of rows.
        image_column: its column of image bytes (binary, or a struct with a ``bytes`` field as
            Hugging Face ``datasets`` writes); ``"image"``.
        label_column: its column of integer labels; ``"label"``.
        unchecked: with ``parquet``, a file with neither page CRCs nor the row checksums ``hetero
            index`` writes: ``"warn"`` reads it, saying so once per file; ``"refuse"`` stops the data
            server at start, naming the file and the fix.
        wire_encoding: how the crops travel to the DNN nodes (:mod:`data_service.contract.wire_encoding`):
            ``"uint8"`` as built; ``"up-zstd"``, lossless, about half the bytes on photographs;
            ``"jpeg:Q"``, each crop re-encoded as JPEG quality ``Q`` (``"jpeg"`` = ``"jpeg:90"``, about
            1/12 of the bytes at a PSNR of about 40 dB). Worth it where the network binds.

    Raises:
        ConfigError: a bad option (:class:`ImageOptions`), a folder or shards without images, fewer
            images than one batch with ``drop_last``.
    """
    opts = ImageOptions.from_kwargs(**options)
    dataset = _source(opts)
    if opts.drop_last and len(dataset) < opts.batch_size:
        raise ConfigError(f"{dataset.root!r} holds {len(dataset)} images, fewer than batch_size={opts.batch_size} "
                          "with drop_last=true: no batch at all; lower batch_size or add images")
    cache = _decoded_cache(opts, dataset.root) if opts.decoded_budget else None
    augment = FusedAugment(opts.image_size, float(opts.min_scale), opts.on_corrupt, opts.dct_scaling, cache,
                           opts.side, deferred=True) if opts.fused \
        else Augment(opts.image_size, float(opts.min_scale))
    # keyword arguments of Pipeline, each dict of several of its fields' types
    hooks: dict[str, Any] = {"stats": cache.stats, "close": cache.close} if cache is not None else {}
    stage: dict[str, Any] = {"collate_fn": collate_finished_on_server} if opts.finish_on == "server" else \
        {"collate_fn": collate, "finish": finish, "finish_dtypes": FINISH_DTYPES}
    return Pipeline(dataset=dataset, batch_size=opts.batch_size, transform=augment, drop_last=opts.drop_last,
                    shuffle=True, shuffle_block=opts.block, interleave=opts.interleave,
                    wire_encoding=opts.wire_encoding, **stage, **hooks)


def server_side(**options) -> ServerSide:
    """What a data server's main process keeps of this pipeline (without building it): the shard
    source as its block prefetcher, and the decoded-image cache's stats and clean-up."""
    opts = ImageOptions.from_kwargs(**options)
    prefetcher = _shards(opts) if opts.shards or opts.parquet else None
    cache = _decoded_cache(opts, opts.shards or opts.parquet or data_root(opts.data_dir)) if opts.decoded_budget \
        else None
    return ServerSide(prefetcher=prefetcher, stats=cache.stats if cache else None,
                      close=cache.close if cache else None)


def worker_imports(**options) -> list[str]:
    """What a data worker of these options imports while it builds and runs the pipeline (kept out
    of this module's imports: a data server's main process imports it too, and needs none of it).
    A data node's warm parent imports them once, before it forks its workers."""
    opts = ImageOptions.from_kwargs(**options)
    names = ["torchvision.io", "torchvision.transforms.v2"]
    if opts.shards:
        names.append("data_service.shards")
    if opts.parquet:
        names += ["data_service.shards.parquet", "pyarrow.parquet"]
    if is_s3_url(opts.shards or opts.parquet):
        names += ["boto3", "botocore.config"]
    return names


# What the data server, a warm parent and the launcher read off the builder, as attributes of the
# function (which mypy types as a plain callable, without them).
_builder: Any = build_pipeline
_builder.server_side = server_side
_builder.worker_imports = worker_imports
# The signature the launcher's checks and help see: ImageOptions' fields and defaults.
_builder.__signature__ = inspect.Signature(
    [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
     for f in fields(ImageOptions) if f.init], return_annotation="Pipeline")
# The folder is listed once when the builder runs and each file is read whole, once per epoch, and
# never written: SageMaker's FastFile mode (files streamed from S3 on first read) serves it as well
# as File mode (hetero submit --input-mode FastFile; see hetero/sagemaker/input_modes.py).
_builder.input_modes = ("File", "FastFile")


def _source(opts: ImageOptions):
    """The shards (``opts.shards``), the Parquet files or the folder, as map-style samples the augmentation takes."""
    if not opts.shards and not opts.parquet:
        return ImageFolder(data_root(opts.data_dir), opts.on_corrupt, opts.limit, decoded=not opts.fused)
    return ShardImages(_shards(opts), opts.on_corrupt, opts.limit, decoded=not opts.fused)


def _shards(opts: ImageOptions):
    """The sample source behind ``shards`` (tar shards) or ``parquet``: (bytes, label) by index, read in blocks."""
    common: dict[str, Any] = {"block_samples": opts.block, "cache_dir": opts.cache_dir,
                              "cache_bytes": opts.shard_cache_budget,
                              "request_timeout_s": float(opts.request_timeout_s)}
    if opts.parquet:
        from ..shards.parquet import ParquetDataset

        return ParquetDataset(opts.parquet, image_column=opts.image_column, label_column=opts.label_column,
                              on_corrupt=opts.on_corrupt, index=opts.index, unchecked=opts.unchecked, **common)
    from ..shards import ShardDataset

    return ShardDataset(opts.shards, index=opts.index, **common)


def _decoded_cache(opts: ImageOptions, root: str) -> DecodedCache:
    # one folder per pipeline (its data and image options) and host, shared by its servers' processes
    # (and entry format: a release that writes entries another way keeps its own folder)
    keys = [opts.shards or opts.parquet or os.path.abspath(str(root)), opts.limit, opts.image_size, opts.side,
            ENTRY_FORMAT.decode().strip()]
    keys += [opts.index] if opts.index else []  # another index numbers the samples differently
    tag = hashlib.blake2b(json.dumps(keys, sort_keys=True).encode(), digest_size=8).hexdigest()
    return DecodedCache(os.path.join(opts.decoded_cache_dir, f"hetero-decoded-{tag}"), opts.decoded_budget)
