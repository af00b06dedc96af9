"""What a data-plane connection keeps beside its socket: the server's shared-memory slots it
mapped (a consumer on the same host), and the socket's low-water mark (a large TCP payload)."""
from __future__ import annotations

import contextlib
import mmap
import os
import socket
import time
import weakref
from typing import Callable

import numpy as np
import torch
from torch.utils.data import get_worker_info

from data_service.contract import compression
from data_service.errors import ProtocolError
from data_service.protocol.generated import pb

from .buffers import BufferPool


class SlotMaps:
    """The slots one connection has mapped, by path; a retired slot's map is replaced."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._maps: dict[str, tuple[int, int, mmap.mmap]] = {}  # path -> (inode, size, map)

    def map(self, header: pb.BatchHeader) -> mmap.mmap:
        """The map of the slot named in ``header`` (checked: a /proc path, large enough, the same inode)."""
        path, size, inode = header.shm_path, header.shm_size, header.shm_inode
        if not path.startswith("/proc/") or header.payload_bytes > size:
            raise ProtocolError(f"{self.address}: bad shared-memory reference {path!r} "
                                f"({header.payload_bytes} of {size} bytes)")
        cached = self._maps.get(path)
        if cached is not None and cached[:2] == (inode, size):
            return cached[2]
        old = self._maps.pop(path, None)
        if old is not None:
            _unmap(old[2])
        fd = os.open(path, os.O_RDWR)  # writable: users may change batch tensors in place
        try:
            if inode and os.fstat(fd).st_ino != inode:
                # The slot was retired and its descriptor number reused before we got here.
                raise ProtocolError(f"{self.address}: shared-memory slot {path!r} was replaced before it was read")
            m = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._maps[path] = (inode, size, m)
        return m

    def batch(self, header: pb.BatchHeader, pool: BufferPool, dropped: Callable[[pb.Release], None],
              release: Callable[[pb.Release], None]) -> torch.Tensor:
        """The batch's bytes as a uint8 tensor: a view of its slot while the server lends it
        (``dropped(its Release)`` runs once no tensor uses it), else a copy, its slot released at once.
        The Release names the slot: this connection may hold two copies of one batch (asked for
        again while the first is kept), and the server must free the one given back."""
        slot = self.map(header)
        done = pb.Release(ref=header.ref, shm_inode=header.shm_inode)
        # Pinned buffers and a loader worker's shared storage need their own copy anyway.
        if (header.shm_lease and not header.compression and header.payload_bytes > 0 and not pool.pin_memory
                and get_worker_info() is None):
            view = memoryview(slot)[:header.payload_bytes]
            buf = torch.frombuffer(view, dtype=torch.uint8)  # keeps ``view`` alive while any tensor uses it
            weakref.finalize(view, dropped, done)
            return buf
        buf = pool.get(header.raw_bytes)
        src = memoryview(slot)[:header.payload_bytes]
        try:
            if header.compression:  # ignore: numpy's stubs make an ndarray a Buffer only for Python >= 3.12
                compression.decompress_into(header.compression, src, memoryview(buf.numpy()))  # type: ignore[arg-type]
            elif header.payload_bytes:
                np.copyto(buf.numpy(), np.frombuffer(src, dtype=np.uint8))
        finally:
            src.release()
        release(done)
        return buf

    def close(self) -> None:
        """Unmap every slot no batch uses (the others when their batches are gone)."""
        for *_, m in self._maps.values():
            _unmap(m)
        self._maps.clear()


def _unmap(m: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # zero-copy batches still use it: unmapped when they are gone
        m.close()


class LowWater:
    """A socket's low-water mark (``SO_RCVLOWAT``): reported by the selector only once ``need``
    more bytes wait, so the rest of a large payload costs one wake-up instead of one per segment."""

    def __init__(self) -> None:
        self.mark = 1
        self.since = 0.0  # when the mark was last raised

    @property
    def active(self) -> bool:
        return self.mark > 1

    def set(self, sock: socket.socket, need: int) -> None:
        """Set the mark to ``need`` bytes (1: any byte). It stays under a quarter of the receive
        buffer: the sender can only fill the window the buffer advertises, and a mark above that
        would never be reached."""
        try:
            n = 1 if need <= 1 else max(1, min(need, sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4))
            if n != self.mark:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)
                self.mark = n
                self.since = time.monotonic()
        except OSError:
            self.mark = 1
