"""How a host batch reaches the training device: the seam between ``DeviceFeeder``'s bookkeeping
and the device's own calls.

``DeviceFeeder`` runs the same loop on every device: ``begin`` a batch (copy it to the device
and run the finish stage, ahead of the step), keep up to ``depth`` begun, and ``ready`` the
oldest before yielding it. ``HostOps`` does that work synchronously (on CPU the finish stage is
the work done ahead). ``StreamOps`` issues it on a side CUDA stream: pinned host memory,
``non_blocking`` copies, an event per batch that the compute stream waits on, and
``record_stream`` so the caching allocator knows the compute stream uses what the side stream
allocated. Every CUDA call goes through a ``CudaBackend``, so tests drive ``StreamOps`` on CPU
with a recording backend, while the real one runs unchanged where a GPU exists.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from data_service.errors import ConfigError


def map_tensors(batch: Any, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn(name, tensor)`` to every tensor of a batch (tensor, dict, list or tuple)."""
    if isinstance(batch, torch.Tensor):
        return fn("", batch)
    if isinstance(batch, dict):
        return {k: fn(k, v) for k, v in batch.items()}
    out = [fn(str(i), v) for i, v in enumerate(batch)]
    return tuple(out) if isinstance(batch, tuple) else out


def unwire(finish: Callable[[Any], Any], batch: Any, device: torch.device) -> Any:
    """The batch with its wire encoding undone for ``device`` by the finish stage (``FinishStage.unwire``)
    when it has one: JPEGs bound for CUDA are decoded there, from the host bytes."""
    decode = getattr(finish, "unwire", None)
    return decode(batch, device) if decode is not None else batch


class CudaBackend:
    """The CUDA calls ``StreamOps`` makes, one method each (the real ones)."""

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device=device)

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def record_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.is_pinned() else tensor.pin_memory()


class HostOps:
    """Devices without streams (CPU): the work is done when a batch is begun."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def begin(self, batch: Any, finish: Callable[[Any], Any]) -> tuple[Any, Any]:
        return finish(map_tensors(unwire(finish, batch, self.device), lambda n, t: t.to(self.device))), None

    def ready(self, out: Any, token: Any) -> Any:
        return out


class StreamOps:
    """CUDA: copies and the finish stage on a side stream, ``depth`` batches ahead of the step."""

    def __init__(self, device: torch.device, pin_memory: bool = True, backend: CudaBackend | None = None) -> None:
        self.device = device
        self.pin_memory = pin_memory
        self.cuda = backend or CudaBackend()
        self.stream = self.cuda.new_stream(device)

    def _pinned(self, name: str, t: torch.Tensor) -> torch.Tensor:
        try:
            return self.cuda.pin(t)
        except RuntimeError as exc:
            raise ConfigError(f"tensor {name!r} ({t.dtype}, {list(t.shape)}) cannot be pinned: {exc}; free host "
                              "memory or pass pin_memory=False to DeviceFeeder (slower, synchronous copies)") from exc

    def begin(self, batch: Any, finish: Callable[[Any], Any]) -> tuple[Any, Any]:
        with self.cuda.use_stream(self.stream):
            # tensors a GPU decoder already put on the device stay as they are
            moved = map_tensors(unwire(finish, batch, self.device),
                                lambda n, t: t if t.is_cuda else
                                (self._pinned(n, t) if self.pin_memory else t).to(self.device, non_blocking=True))
            out = finish(moved)
        # The host batch rides along with the event: its memory (a pooled receive buffer) must
        # not be reused before the copy has read it.
        return out, (self.cuda.record_event(self.stream), batch)

    def ready(self, out: Any, token: Any) -> Any:
        event, _host = token
        current = self.cuda.current_stream(self.device)
        self.cuda.wait_event(current, event)
        # The copy was issued ``depth`` steps ago: in steady state this returns at once. After it
        # the host batch may be dropped and its buffer reused.
        self.cuda.synchronize(event)
        # The side stream allocated these; tell the caching allocator the compute stream uses them.
        def used_by_current(_: str, t: torch.Tensor) -> torch.Tensor:
            self.cuda.record_stream(t, current)
            return t

        map_tensors(out, used_by_current)
        return out


def ops_for(device: torch.device, pin_memory: bool) -> HostOps | StreamOps:
    """The ops for ``device``: ``StreamOps`` on CUDA, ``HostOps`` elsewhere."""
    return StreamOps(device, pin_memory) if device.type == "cuda" else HostOps(device)
