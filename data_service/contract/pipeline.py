"""The user's pipeline: dataset + per-sample transform + batch size + collate.

A user names a builder by import path (``mypkg.data:build_pipeline``) plus
JSON-able keyword options; every worker process imports and calls it itself,
so nothing user-defined is ever pickled or sent over the network.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from .wire import WireEncoding
from .wire import parse as parse_wire
from ..errors import ConfigError, check_integer
from .plugins import check_call, import_module
from .sampler import EpochShape, batch_indices, derive_seed

log = logging.getLogger(__name__)


# Samples this process read a second time because the first read failed its checksum (a bad cached
# copy, recovered from the source). Process-wide: the sample sources that re-read sit below any
# pipeline; data workers report the per-batch difference, which the server's samples_reread adds up.
_rereads = [0]


def count_reread() -> None:
    """Count one sample read again after its checksum failed (called by the sample sources)."""
    _rereads[0] += 1


def samples_reread() -> int:
    """Samples this process has read again after a checksum failure (see :func:`count_reread`)."""
    return _rereads[0]


@dataclass
class Pipeline:
    """What a builder function returns.

    Args:
        dataset: a map-style dataset (``__len__`` and ``__getitem__``).
        batch_size: samples per batch.
        transform: per-sample callable (torchvision transforms v2 or any
            function) applied to ``dataset[i]``; None for identity.
        collate_fn: turns a list of samples into a batch: a tensor, a dict of
            tensors or a tuple/list of tensors. Defaults to torch's
            ``default_collate``.
        drop_last: drop the last partial batch of each epoch.
        shuffle: permute samples each epoch from (seed, epoch).
        finish: optional device-side last stage, run by the consumer on the
            training device (cheap elementwise work such as uint8 -> float
            normalisation), so batches travel in compact dtypes. An import path
            ``"pkg.mod:fn"`` or a module-level function; it takes and returns a
            batch of the same structure and shapes.
        finish_dtypes: tensors whose dtype ``finish`` changes, name -> new dtype
            (e.g. ``{"image": "float32"}``); any other change is an error.
        shuffle_block: 0 for a full shuffle; else samples per shuffle block (rounded up to a
            multiple of ``batch_size``): each batch draws from one block of consecutive
            indices, the order data stored as shards wants (``data_service.contract.sampler``).
        interleave: with ``shuffle_block``, blocks whose batches alternate in the epoch.

        stats: optional ``stats() -> {name: number}``: figures of the pipeline's own (a cache's
            size, say) that the data server adds to its stats (``hetero stats``).
        close: optional ``close()``: the data server calls it once when it shuts down (to free
            what the pipeline holds outside its processes, such as files on a tmpfs).
        wire_encoding: how image tensors travel (:mod:`data_service.contract.wire_encoding`): ``"uint8"``
            as built, ``"up-zstd"`` (lossless) or ``"jpeg:Q"`` (lossy). The workers encode every
            uint8 ``[B, C, H, W]`` tensor of the collated batch; consumers decode it before
            ``finish``.

    A data server's main process never builds the pipeline: it calls the ``stats`` and ``close``
    of the builder's ``server_side`` (:class:`ServerSide`). Those set here serve where the pipeline
    is built in-process (the profile, a user's own loop); a data server whose builder sets them
    without a ``server_side`` says so at start.
    """

    dataset: Any
    batch_size: int
    transform: Callable[[Any], Any] | None = None
    collate_fn: Callable[[list], Any] | None = None
    drop_last: bool = False
    shuffle: bool = True
    finish: Callable[[Any], Any] | str | None = None
    finish_dtypes: Mapping[str, str] | None = None
    shuffle_block: int = 0
    interleave: int = 8
    stats: Callable[[], Mapping[str, float]] | None = None
    close: Callable[[], None] | None = None
    wire_encoding: "str | WireEncoding" = "uint8"  # parsed once, here: a WireEncoding after construction
    # Samples this process dropped (SkipSample) since the pipeline was built; data workers report
    # the per-batch difference, which the server's samples_skipped stat adds up.
    samples_skipped: int = field(default=0, init=False, compare=False)

    def __post_init__(self) -> None:
        self.wire_encoding = parse_wire(self.wire_encoding)  # ConfigError naming an unknown name or quality

    def finish_target(self) -> str:
        """The finish stage as an import path ("" when there is none), for consumers to load."""
        if self.finish is None:
            return ""
        if isinstance(self.finish, str):
            target = self.finish
        else:
            module, name = getattr(self.finish, "__module__", None), getattr(self.finish, "__qualname__", "")
            if not module or not name or "<" in name or "." in name:
                raise ConfigError(f"finish={self.finish!r} must be a module-level function (or an import path) so "
                                  "consumers can import it")
            target = f"{module}:{name}"
        try:
            PipelineSpec(target).resolve()  # fails now if it does not import
        except ConfigError as exc:
            raise ConfigError(f"the pipeline's finish stage: {exc}".replace("pipeline=", "finish=", 1)) from None
        return target

    def epoch_shape(self) -> EpochShape:
        if not hasattr(self.dataset, "__getitem__") or not hasattr(self.dataset, "__len__"):
            raise ConfigError(f"dataset of type {type(self.dataset).__name__} is not map-style: it needs "
                              "__len__ and __getitem__ (wrap an iterable source in a map-style dataset)")
        block = self.shuffle_block
        check_integer("shuffle_block", block, 0, hint=" (samples per shuffle block; 0 = a full shuffle)")
        if block:
            block = -(-block // self.batch_size) * self.batch_size if isinstance(self.batch_size, int) else block
        return EpochShape(len(self.dataset), self.batch_size, self.drop_last, self.shuffle,
                          block, self.interleave if block else 1)


class BlockPrefetcher(Protocol):
    """Fetches a data set's blocks ahead of the workers that read them (a shard source from S3, say).

    Block ``b`` is samples ``[b * block_samples, (b + 1) * block_samples)``. The data server calls
    ``prefetch_block`` in its main process, once per block and epoch whether a consumer's hint or
    its request names the block first; it must return at once (fetch on a thread of its own) and
    may skip a block it already holds.
    """

    block_samples: int

    def prefetch_block(self, block: int) -> None:
        """Start fetching block ``block``; return without waiting for it."""


@dataclass
class ServerSide:
    """What a data server's main process keeps of a pipeline, built without its data set or transforms.

    A builder declares it as a function attribute taking the builder's own options::

        def build_pipeline(**options) -> Pipeline: ...
        build_pipeline.server_side = lambda **options: ServerSide(prefetcher=...)

    The main process then never calls the builder: the workers build the pipeline and report its
    plan (:class:`PipelineInfo`).

    Args:
        prefetcher: fetches blocks ahead of the workers (:class:`BlockPrefetcher`); None: none.
        stats: ``stats() -> {name: number}`` added to the server's stats (``hetero stats``).
        close: called once when the server shuts down.
    """

    prefetcher: BlockPrefetcher | None = None
    stats: Callable[[], Mapping[str, float]] | None = None
    close: Callable[[], None] | None = None


@dataclass(frozen=True)
class PipelineInfo:
    """What a data server needs of a pipeline its workers built: each worker reports it when ready."""

    plan: EpochShape
    finish: str                      # the finish stage's import path ("" : none)
    finish_dtypes: Mapping[str, str]
    hooks: tuple[str, ...] = ()      # which of Pipeline's stats and close the builder set
    wire_encoding: WireEncoding = WireEncoding()

    @classmethod
    def of(cls, pipe: Pipeline) -> "PipelineInfo":
        """Checks the pipeline's plan, finish stage and wire encoding (ConfigError naming the value and
        the fix; an encoder this node lacks is one too)."""
        from . import wire_encoding

        wire = parse_wire(pipe.wire_encoding)
        wire_encoding.check_encoder(wire)
        return cls(pipe.epoch_shape(), pipe.finish_target(), dict(pipe.finish_dtypes or {}),
                   tuple(name for name in ("stats", "close") if getattr(pipe, name) is not None), wire)


@dataclass(frozen=True)
class PipelineSpec:
    """An importable pipeline: ``target`` is ``"package.module:function"``."""

    target: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or self.target.count(":") != 1:
            raise ConfigError(f"pipeline={self.target!r} must look like 'package.module:function'")
        try:
            json.dumps(dict(self.options), sort_keys=True)
        except TypeError as exc:
            raise ConfigError(f"pipeline options {dict(self.options)!r} must be JSON values: {exc}") from None

    def to_json(self) -> str:
        return json.dumps({"target": self.target, "options": dict(self.options)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PipelineSpec":
        data = json.loads(text)
        return cls(data["target"], data.get("options", {}))

    def fingerprint(self) -> str:
        """Servers of one job must agree on this; consumers check it."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def resolve(self) -> Callable[..., Pipeline]:
        """The builder function the target names, imported.

        Raises:
            ConfigError: the module does not import (naming what is missing and the fix), or has
                no such callable.
        """
        module_name, func_name = self.target.split(":")
        module = import_module(self.target, "pipeline")
        func = getattr(module, func_name, None)
        if not callable(func):
            raise ConfigError(f"pipeline={self.target!r}: module {module_name!r} has no callable {func_name!r}")
        return func

    def check_options(self) -> None:
        """Import the builder and check that it takes these options (names only, nothing is built).

        Raises:
            ConfigError: the builder does not import, or does not take an option; the message
                lists its parameters.
        """
        check_call(self.resolve(), self.options, "pipeline", self.target)

    def server_side(self) -> ServerSide | None:
        """The builder's ``server_side(**options)`` called (see :class:`ServerSide`); None when the
        builder declares none.

        Raises:
            ConfigError: the builder does not import, or its ``server_side`` rejects the options or
                returns something else.
        """
        factory = getattr(self.resolve(), "server_side", None)
        if factory is None:
            return None
        try:
            side = factory(**dict(self.options))
        except TypeError as exc:
            raise ConfigError(f"pipeline={self.target!r}: its server_side rejected options {dict(self.options)!r}: "
                              f"{exc}") from exc
        if not isinstance(side, ServerSide):
            raise ConfigError(f"pipeline={self.target!r}: its server_side returned {type(side).__name__}; it must "
                              "return data_service.contract.pipeline.ServerSide(...)")
        return side

    def load(self) -> Pipeline:
        """Import and call the builder; check what it returns."""
        func = self.resolve()
        try:
            pipe = func(**dict(self.options))
        except TypeError as exc:
            raise ConfigError(f"pipeline={self.target!r} rejected options {dict(self.options)!r}: {exc}") from exc
        if not isinstance(pipe, Pipeline):
            raise ConfigError(f"pipeline={self.target!r} returned {type(pipe).__name__}; it must return "
                              "data_service.Pipeline(dataset=..., batch_size=...)")
        pipe.epoch_shape()  # validates dataset and batch size now, not mid-epoch
        return pipe


class SkipSample(Exception):
    """Raised by a dataset or transform to drop one sample (a corrupt file, say) instead of failing.

    The batch comes out that many samples shorter; the drop is logged with the message and
    counted (``Pipeline.samples_skipped``, the data server's ``samples_skipped`` stat). The
    message should name what was skipped and why; ``where`` the file or shard it came from, which
    the error for a batch whose every sample was skipped names.
    """

    def __init__(self, message: str = "", *, where: str = "") -> None:
        super().__init__(message)
        self.where = where


def all_skipped(skips: list[SkipSample]) -> ValueError:
    """The error for a batch whose every sample was skipped: how many, from which files or shards, the first reason."""
    places = collections.Counter(s.where for s in skips if s.where)
    named = ", ".join(f"{n} from {where}" for where, n in places.most_common(4))
    more = f" and {len(places) - 4} more places" if len(places) > 4 else ""
    source = f" ({named}{more})" if places else ""
    return ValueError(f"every one of the {len(skips)} samples of this batch was skipped{source}; the first: "
                      f"{skips[0]} (see the skipped-sample warnings in the data node's log)")


class SampleError(Exception):
    """User code failed on one sample (or in collate: sample_index -1)."""

    def __init__(self, sample_index: int, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.sample_index = sample_index
        self.cause = cause


def seed_everything(seed: int) -> None:
    """Seed torch (CPU), numpy and random so augmentation depends only on ``seed``."""
    import torch

    # Not torch.manual_seed: it also queues lazy seeding of every accelerator
    # backend, recording a stack trace each time (about 1 ms per batch).
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))


def build_batch(pipe: Pipeline, cfg: EpochShape, seed: int, epoch: int, index: int) -> Any:
    """Build batch ``index`` of ``epoch``: the one function every mode uses.

    Random augmentation is seeded from (seed, epoch, index) and the thread
    count is pinned to 1, so the bytes do not depend on which server, process
    or thread built the batch.

    Raises:
        IndexError: (epoch, index) is outside the plan.
        SampleError: user code raised; carries the sample index.
    """
    # torch is imported where batches are built (workers, in-process loaders), not by a data
    # server's main process, which starts its workers first
    import torch
    from torch.utils.data import default_collate

    from . import wire_encoding

    indices = batch_indices(cfg, seed, epoch, index)
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        seed_everything(derive_seed(seed, epoch, index))
        samples, skipped = [], []
        for sample_index in indices:
            try:
                sample = pipe.dataset[sample_index]
                if pipe.transform is not None:
                    sample = pipe.transform(sample)
            except SkipSample as exc:
                pipe.samples_skipped += 1
                skipped.append(exc)
                log.warning("epoch %d, batch %d: skipped sample %d: %s", epoch, index, sample_index, exc)
                continue
            except Exception as exc:  # user code: carried to the consumer with context
                raise SampleError(sample_index, exc) from exc
            samples.append(sample)
        if not samples:
            raise SampleError(-1, all_skipped(skipped))
        try:
            batch = (pipe.collate_fn or default_collate)(samples)
            # encoded here, in the one function every mode uses: homogeneous and heterogeneous
            # jobs carry and decode the same bytes
            return wire_encoding.encode_batch(batch, parse_wire(pipe.wire_encoding))
        except Exception as exc:
            raise SampleError(-1, exc) from exc
    finally:
        if threads != 1:
            torch.set_num_threads(threads)
