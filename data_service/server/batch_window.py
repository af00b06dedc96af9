"""The batch window: built batches a data server keeps for every job that asks, within a byte budget.

Jobs of a sweep that read one data group with the same pipeline and seed ask for the same
batches. A batch is a pure function of (pipeline, seed, epoch, index), so once built it can be
sent to each of them, and once gone it can be built again, bit for bit. The window holds the
most recently built batches, oldest out first (FIFO: the window slides behind the job that builds
ahead), keyed by everything that makes a batch's bytes (``BatchKey``), so a lookup never returns
another batch.

Memory: ``held_bytes`` (header and payload bytes of the batches held, plus those of batches
that left the window while a send of them was still under way) never exceeds ``budget``. A batch
being sent is pinned; it leaves the index when evicted but its bytes count until the last send
ends. A batch that does not fit (larger than the budget, or the budget is pinned) is not taken.

The window holds no lock: its owner (shared_builds.SharedBuilds) calls it under its own.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..storage.parsing import parse_size

if TYPE_CHECKING:
    from ..contract.batch_id import BatchId
    from ..contract.wire import WireEncoding


@dataclass(frozen=True)
class BatchKey:
    """Everything that makes a batch's bytes: the pipeline (its fingerprint), how the batch is
    encoded and compressed on the wire, and which batch it is."""

    fingerprint: str
    wire_encoding: WireEncoding
    compression: str
    batch: BatchId
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # computed once: every request looks its key up several times (window, builds in flight)
        object.__setattr__(self, "_hash", hash((self.fingerprint, self.wire_encoding, self.compression, self.batch)))

    def __hash__(self) -> int:
        return self._hash


class Entry:
    """One built batch held by the window: the worker's serialized header and a copy of its payload."""

    __slots__ = ("key", "header", "data", "size", "pins", "indexed", "raw_bytes")

    def __init__(self, key: BatchKey, header: bytes, payload, raw_bytes: int) -> None:
        self.key = key
        self.header = header
        self.data = bytes(payload)  # a copy: the worker's slot goes back to it at once
        self.size = len(header) + len(self.data)
        self.raw_bytes = raw_bytes
        self.pins = 0        # sends under way
        self.indexed = True  # still found by ``get`` (False once evicted)


def window_budget(value: int | str) -> int:
    """Bytes from a size such as ``2GB`` or an integer (0: no window).

    Raises:
        ConfigError: not a size, or negative; the message names the value and the form.
    """
    try:
        return parse_size(value, "batch_window")
    except ConfigError:
        raise ConfigError(f"batch_window={value!r} must be a size such as 2GB or 512MiB (0: no window, every "
                          "job's batches are built for it alone)") from None


class BatchWindow:
    """Built batches by ``BatchKey``, oldest out first, within ``budget`` bytes (module docstring).

    Args:
        budget: the most bytes held at once, pinned batches included (> 0).
    """

    def __init__(self, budget: int) -> None:
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ConfigError(f"budget={budget!r} must be a positive number of bytes")
        self.budget = budget
        self.held_bytes = 0    # every entry indexed, and every evicted one still being sent
        self.pinned_bytes = 0  # entries with a send under way (indexed or not)
        self.evicted = 0
        self.refused = 0  # batches not taken: larger than the budget, or the budget pinned by sends
        self._index: collections.OrderedDict[BatchKey, Entry] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: BatchKey) -> bool:
        return key in self._index

    def get(self, key: BatchKey) -> Entry | None:
        """The batch held for ``key`` (pinned: ``unpin`` it once sent), or None."""
        entry = self._index.get(key)
        if entry is not None:
            self._pin(entry)
        return entry

    def put(self, key: BatchKey, header: bytes, payload, raw_bytes: int = 0) -> Entry | None:
        """Hold a copy of a built batch, evicting the oldest unpinned batches to make room.

        Returns the entry, pinned once for the caller, or None when it cannot be held (the
        caller sends the batch from where it lies). A batch already held is returned as it is.
        """
        held = self.get(key)
        if held is not None:
            return held
        size = len(header) + len(payload)
        if self.pinned_bytes + size > self.budget:
            self.refused += 1  # no eviction could make room: leave the window as it is
            return None
        while self.held_bytes + size > self.budget:  # the oldest unpinned first; they exist (checked above)
            self._evict(next(e for e in self._index.values() if e.pins == 0))
        entry = Entry(key, header, payload, raw_bytes)
        self._index[key] = entry
        self.held_bytes += entry.size
        self._pin(entry)
        return entry

    def pin(self, entry: Entry, times: int = 1) -> None:
        """``times`` more sends of ``entry`` start (each ends with ``unpin``)."""
        for _ in range(times):
            self._pin(entry)

    def unpin(self, entry: Entry) -> None:
        """A send of ``entry`` ended; an evicted entry's bytes are freed with its last send."""
        if entry.pins <= 0:
            raise RuntimeError(f"batch {entry.key} unpinned more often than pinned")
        entry.pins -= 1
        if entry.pins == 0:
            self.pinned_bytes -= entry.size
            if not entry.indexed:
                self._free(entry)

    def _pin(self, entry: Entry) -> None:
        if entry.pins == 0:
            self.pinned_bytes += entry.size
        entry.pins += 1

    def _evict(self, entry: Entry) -> None:
        """Take ``entry`` out of the index; its bytes go now, or with its last send."""
        del self._index[entry.key]
        entry.indexed = False
        self.evicted += 1
        if entry.pins == 0:
            self._free(entry)

    def _free(self, entry: Entry) -> None:
        self.held_bytes -= entry.size
        entry.data = b""

    def clear(self) -> None:
        """Drop every batch (the server stops); pinned ones are freed by their last send."""
        for entry in list(self._index.values()):
            self._evict(entry)
