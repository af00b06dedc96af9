"""What the scheduler knows of one data server: what it owes, and how fast it delivers.

A ``Lane`` measures its server's throughput as the time between batches *while it has work*
(an idle server is not a slow one): ``gap`` is a moving average of those times, so
``1 / gap`` batches per second is what the server delivers to this consumer now. From it the
lane predicts when the k-th batch it owes will arrive (``done_at``), which is how the scheduler
gives each batch to the server that will deliver it first. ``Lanes`` holds every server's lane
and their windows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from data_service.contract.batch_id import BatchId

SPEED_WEIGHT = 0.25  # weight of the newest time between batches in the moving average
BLOCKS_REMEMBERED = 16  # shuffle blocks a server built lately, taken as still in its cache (affinity)


@dataclass
class Lane:
    """One server as the scheduler sees it (no connection, no I/O).

    ``base_window``: its window for large batches; ``window``: its window now (wider while
    batches are small). ``weight``: its share of shuffle blocks under affinity (its worker
    processes, the same figure on every consumer). ``outstanding``: each batch it owes and when it
    was asked for, in the order of asking.
    """

    address: str
    base_window: int = 4
    window: int = 4
    weight: float = 1.0
    outstanding: dict[BatchId, float] = field(default_factory=dict)
    delivered: int = 0
    last_progress: float = 0.0  # its last batch, or when it was last given work while owing nothing
    busy_since: float = 0.0     # when it last went from owing nothing to owing something
    last_batch: float = 0.0
    gap: float = 0.0            # seconds between its batches while it has work (0: not measured yet)
    blocks: dict[int, None] = field(default_factory=dict)  # shuffle blocks it built lately, oldest first

    def asked(self, batches: list[BatchId], now: float) -> None:
        if not self.outstanding:
            self.busy_since = now
            self.last_progress = now
        for b in batches:
            self.outstanding[b] = now

    def settled(self, batch: BatchId) -> bool:
        """``batch`` is no longer owed (it came, or was answered); False if it was not owed."""
        return self.outstanding.pop(batch, None) is not None

    def arrived(self, now: float) -> None:
        """One of its batches arrived (already taken out of ``outstanding``)."""
        start = max(self.last_batch, self.busy_since)
        if start:
            took = now - start
            self.gap = took if not self.gap else (1 - SPEED_WEIGHT) * self.gap + SPEED_WEIGHT * took
        self.delivered += 1
        self.last_batch = self.last_progress = now

    def built_block(self, block: int) -> None:
        self.blocks.pop(block, None)
        self.blocks[block] = None
        if len(self.blocks) > BLOCKS_REMEMBERED:
            del self.blocks[next(iter(self.blocks))]

    def room(self) -> int:
        return self.window - len(self.outstanding)

    def done_at(self, k: int, now: float, default_gap: float) -> float:
        """When the ``k``-th batch it owes (1: the oldest request), or would owe, should arrive.

        Batches leave a server one ``gap`` apart. A server late on its next batch is taken to be
        slower by as much as it is late: the longer it stays quiet, the later it is expected."""
        gap = self.gap or default_gap
        if not self.outstanding:
            return now + k * gap
        start = max(self.last_batch, self.busy_since)
        late = now - start - gap
        if late <= 0:
            return start + k * gap
        return now + (k - 1) * gap + late

    def rank(self, batch: BatchId) -> int:
        """1-based place of ``batch`` among the requests it owes, in the order they were asked."""
        for i, owed in enumerate(self.outstanding, 1):
            if owed == batch:
                return i
        return len(self.outstanding)


class Lanes(dict[str, Lane]):
    """Every server's lane, by address, and their windows: each its own, widened to
    ``small_window`` while batches are small (they cost per batch, not per byte)."""

    def __init__(self, small_window: int = 0) -> None:
        super().__init__()
        self.small_window = small_window
        self.small = False  # batches seen so far are small (the scheduler decides what is)

    def lane(self, address: str, window: int = 4, weight: float = 1.0) -> Lane:
        """The lane of ``address`` (made on first use), with its window and affinity weight."""
        lane = self.get(address)
        if lane is None:
            lane = self[address] = Lane(address, window, window, weight)
        else:
            lane.base_window, lane.weight = window, weight
        lane.window = self._window(window)
        return lane

    def _window(self, base: int) -> int:
        return max(self.small_window, base) if self.small else base

    def set_small(self, small: bool) -> None:
        """Batches are small now (or no longer): every window widens (or narrows) with them."""
        if self.small_window and small != self.small:
            self.small = small
            for lane in self.values():
                lane.window = self._window(lane.base_window)

    def owes(self, address: str) -> bool:
        lane = self.get(address)
        return bool(lane and lane.outstanding)

    def owing(self, batch: BatchId) -> bool:
        """Some server still owes ``batch``."""
        return any(batch in lane.outstanding for lane in self.values())

    def stalled(self, now: float, timeout: float) -> list[str]:
        """Servers that owe batches and delivered none for ``timeout`` seconds."""
        return [a for a, lane in self.items() if lane.outstanding and now - lane.last_progress > timeout]

    def default_gap(self) -> float:
        """The gap of a server not measured yet: the others' mean (1 s when none is measured)."""
        gaps = [lane.gap for lane in self.values() if lane.gap]
        return sum(gaps) / len(gaps) if gaps else 1.0
