"""Receive buffers for the data plane.

A fresh 16 MB allocation costs thousands of page faults and a kernel zero-fill
per batch; raw TCP reuses one buffer. ``BufferPool`` reuses a buffer once no
tensor of an earlier batch refers to it any more (its storage use count is back
to the pool's own reference), so batches the user still holds are never
overwritten. Pinned buffers (cudaHostAlloc) are far dearer still, so they are
always pooled.

Inside a DataLoader worker process buffers are allocated in shared memory
instead: the loader then hands the storage to the main process without the
copy it would otherwise make; those are never reused by us.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch
from torch.utils.data import get_worker_info

_use_count: Callable[[int], int] | None
try:
    _use_count = torch._C._storage_Use_Count  # private, stable since torch 1.x; pooling is off without it
except AttributeError:  # pragma: no cover
    _use_count = None


class BufferPool:
    """Hands out uint8 tensors of at least ``n`` bytes.

    Args:
        pin_memory: allocate page-locked memory (for fast, async host-to-GPU copies).
        max_buffers: buffers kept for reuse; beyond that, allocations are not pooled.
    """

    def __init__(self, pin_memory: bool = False, max_buffers: int = 16) -> None:
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.max_buffers = max_buffers
        self._free: list[tuple[torch.Tensor, int]] = []
        self._lock = threading.Lock()
        self.reused = 0
        self.allocated = 0

    def get(self, n: int) -> torch.Tensor:
        if get_worker_info() is not None:  # in a DataLoader worker
            storage = torch.UntypedStorage._new_shared(max(n, 1))
            self.allocated += 1
            return torch.empty(0, dtype=torch.uint8).set_(storage)[:n]
        if _use_count is not None:
            with self._lock:
                for buf, base in self._free:
                    if buf.numel() >= n and _use_count(buf.untyped_storage()._cdata) == base:
                        self.reused += 1
                        return buf[:n]
        buf = torch.empty(n, dtype=torch.uint8, pin_memory=self.pin_memory)
        self.allocated += 1
        if _use_count is not None:
            with self._lock:
                if len(self._free) < self.max_buffers:
                    self._free.append((buf, _use_count(buf.untyped_storage()._cdata)))
                elif self._free:
                    # Replace the smallest idle buffer so sizes track the current batches.
                    idle = [i for i, (b, c) in enumerate(self._free) if _use_count(b.untyped_storage()._cdata) == c]
                    if idle:
                        i = min(idle, key=lambda i: self._free[i][0].numel())
                        self._free[i] = (buf, _use_count(buf.untyped_storage()._cdata))
        return buf[:n]
