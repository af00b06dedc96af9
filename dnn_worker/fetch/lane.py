"""What the scheduler knows of one data server: what it owes, and how fast it delivers.

A ``Lane`` measures its server's throughput as the time between batches *while it has work*
(an idle server is not a slow one): ``gap`` is a moving average of those times, so
``1 / gap`` batches per second is what the server delivers to this consumer now. From it the
lane predicts when the k-th batch it owes will arrive (``done_at``), which is how the scheduler
gives each batch to the server that will deliver it first.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from data_service.protocol.generated import pb

Key = tuple[int, int, int]
SPEED_WEIGHT = 0.25  # weight of the newest time between batches in the moving average
BLOCKS_REMEMBERED = 16  # shuffle blocks a server built lately, taken as still in its cache (affinity)


def key(ref: pb.BatchRef) -> Key:
    return ref.seed, ref.epoch, ref.index


@dataclass
class Lane:
    """One server as the scheduler sees it (no connection, no I/O).

    ``base_window``: its window for large batches; ``window``: its window now (wider while
    batches are small). ``weight``: its share of shuffle blocks under affinity (its worker
    processes, the same figure on every consumer). ``outstanding`` keeps the order of asking.
    """

    address: str
    base_window: int = 4
    window: int = 4
    weight: float = 1.0
    outstanding: dict[Key, pb.BatchRef] = field(default_factory=dict)
    asked_at: dict[Key, float] = field(default_factory=dict)  # when each outstanding batch was asked for
    delivered: int = 0
    last_progress: float = 0.0  # its last batch, or when it was last given work while owing nothing
    busy_since: float = 0.0     # when it last went from owing nothing to owing something
    last_batch: float = 0.0
    gap: float = 0.0            # seconds between its batches while it has work (0: not measured yet)
    blocks: dict[int, None] = field(default_factory=dict)  # shuffle blocks it built lately, oldest first

    def asked(self, refs: list[pb.BatchRef], now: float) -> None:
        if not self.outstanding:
            self.busy_since = now
            self.last_progress = now
        for ref in refs:
            k = key(ref)
            self.outstanding[k] = ref
            self.asked_at[k] = now

    def settled(self, k: Key) -> pb.BatchRef | None:
        """``k`` is no longer owed (it came, or was answered): its ref, None if it was not owed."""
        self.asked_at.pop(k, None)
        return self.outstanding.pop(k, None)

    def forget_all(self) -> None:
        """Owes nothing any more (its server failed)."""
        self.outstanding.clear()
        self.asked_at.clear()

    def arrived(self, now: float) -> None:
        """One of its batches arrived (the ref already taken out of ``outstanding``)."""
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

    def rank(self, k: Key) -> int:
        """1-based place of ``k`` among the requests it owes, in the order they were asked."""
        for i, owed in enumerate(self.outstanding, 1):
            if owed == k:
                return i
        return len(self.outstanding)
