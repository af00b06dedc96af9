"""Device-side finishing and pinned, overlapped delivery to the training device.

    feeder = DeviceFeeder(loader, device="cuda", finish=ds.finish_stage())
    for batch in feeder:      # batches on the device, finished (e.g. uint8 -> normalised float32)
        ...

Batches travel in compact dtypes (uint8 images); the pipeline's ``finish``
stage runs on the consumer's device. On CUDA, host tensors are pinned (or
already are: ``RemoteDataset(pin_memory=True)`` receives into pinned buffers)
and copied on a side stream ``depth`` batches ahead of the training step, so
the copy overlaps compute. On CPU the finish stage runs in place of the copy.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from data_service.codec import DTYPES, flatten
from data_service.errors import ConfigError, DataServiceError
from data_service.pipeline import PipelineSpec
from data_service.wire import pb


class FinishError(DataServiceError):
    """The finish stage changed a batch in a way the pipeline did not declare."""


@dataclass(frozen=True)
class FinishStage:
    """A pipeline's device-side last stage and the dtype changes it may make."""

    fn: Callable[[Any], Any] | None = None
    dtypes: Mapping[str, str] = field(default_factory=dict)
    target: str = ""

    @classmethod
    def load(cls, target: str, dtypes: Mapping[str, str] | None = None) -> "FinishStage":
        dtypes = dict(dtypes or {})
        bad = {k: v for k, v in dtypes.items() if v not in DTYPES}
        if bad:
            raise ConfigError(f"finish_dtypes {bad} name unknown dtypes; use one of {sorted(DTYPES)}")
        return cls(PipelineSpec(target).resolve() if target else None, dtypes, target)

    def __call__(self, batch: Any) -> Any:
        if self.fn is None:
            return batch
        out = self.fn(batch)
        self.check(batch, out)
        return out

    def check(self, before: Any, after: Any) -> None:
        """Raise FinishError naming the tensor whose structure, shape or dtype changed unexpectedly."""
        s0, items0 = flatten(before)
        try:
            s1, items1 = flatten(after)
        except ConfigError as exc:
            raise FinishError(f"finish stage {self.target!r} returned something that is not a batch: {exc}") from None
        names0, names1 = [n for n, _ in items0], [n for n, _ in items1]
        if s0 != s1 or names0 != names1:
            raise FinishError(f"finish stage {self.target!r} changed the batch's entries from {names0} to {names1}; "
                              "it must return the same structure")
        for (name, a), (_, b) in zip(items0, items1):
            if a.shape != b.shape:
                raise FinishError(f"finish stage {self.target!r} changed tensor {name!r} from shape "
                                  f"{list(a.shape)} to {list(b.shape)}; reshape on the data server instead")
            expected = DTYPES[self.dtypes[name]] if name in self.dtypes else a.dtype
            if b.dtype != expected:
                raise FinishError(f"finish stage {self.target!r} turned tensor {name!r} into {b.dtype}, expected "
                                  f"{expected}; declare it in Pipeline(finish_dtypes={{{name!r}: ...}})")


def finish_from_info(info: pb.DatasetInfo) -> FinishStage:
    return FinishStage.load(info.finish, dict(info.finish_dtypes))


def _map_tensors(batch: Any, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn("", batch)
    if isinstance(batch, dict):
        return {k: fn(k, v) for k, v in batch.items()}
    out = [fn(str(i), v) for i, v in enumerate(batch)]
    return tuple(out) if isinstance(batch, tuple) else out


def _pinned(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.is_pinned():
        return t
    try:
        return t.pin_memory()
    except RuntimeError as exc:
        raise ConfigError(f"tensor {name!r} ({t.dtype}, {list(t.shape)}) cannot be pinned: {exc}; free host memory "
                          "or pass pin_memory=False to DeviceFeeder (slower, synchronous copies)") from exc


class DeviceFeeder:
    """Iterate batches already on ``device`` and finished, ``depth`` batches ahead.

    Args:
        iterable: yields host batches (a DataLoader over RemoteDataset/LocalDataset).
        device: target device ("cuda", "cuda:1", "cpu").
        finish: the pipeline's ``FinishStage`` (``dataset.finish_stage()``), or None.
        depth: batches copied ahead of the one being trained on (bounded).
        pin_memory: pin host tensors before copying (CUDA only).
    """

    def __init__(self, iterable: Iterable, device: str | torch.device = "cpu", finish: FinishStage | None = None,
                 depth: int = 2, pin_memory: bool = True) -> None:
        if depth < 1:
            raise ConfigError(f"depth={depth} must be >= 1")
        self.iterable = iterable
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} but CUDA is not available; use device='cpu'")
        self.finish = finish or FinishStage()
        self.depth = depth
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        return len(self.iterable)

    def __iter__(self) -> Iterator[Any]:
        if self.device.type != "cuda":
            for batch in self.iterable:
                yield self.finish(_map_tensors(batch, lambda n, t: t.to(self.device)))
            return
        stream = torch.cuda.Stream(device=self.device)
        pending: collections.deque = collections.deque()
        it = iter(self.iterable)

        def start(batch):
            with torch.cuda.stream(stream):
                moved = _map_tensors(batch, lambda n, t: (_pinned(n, t) if self.pin_memory else t)
                                     .to(self.device, non_blocking=True))
            event = torch.cuda.Event()
            event.record(stream)
            return moved, event

        exhausted = False
        while True:
            while not exhausted and len(pending) < self.depth:
                try:
                    pending.append(start(next(it)))
                except StopIteration:
                    exhausted = True
            if not pending:
                return
            moved, event = pending.popleft()
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            # The side stream allocated these; tell the caching allocator the compute stream uses them.
            _map_tensors(moved, lambda n, t: (t.record_stream(current), t)[1])
            yield self.finish(moved)
