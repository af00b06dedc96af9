"""Which blocks a consumer announces to their owners ahead of time (a block-shuffled plan).

A data node reading shards fetches a shuffle block whole (``affinity.py``). Told of a block
before the block's first batch is asked for, its owner starts that fetch early, so the data is
there when the batches come. Each block is announced once, at its first batch in the consumer's
list; those first batches are found as the consumer moves down the list, never for a whole
epoch of millions of batches at start.
"""
from __future__ import annotations

from typing import Sequence, cast

from data_service.contract.batch_id import BatchId

from .affinity import Affinity


class BlockHints:
    """The batches of ``batches`` that open a block, each announced once to its owner.

    Args:
        batches: the batches, in the order the consumer needs them (a list or a
            ``batch_list.BatchList``).
        affinity: the plan's blocks and owners.
    """

    def __init__(self, batches: Sequence[BatchId], affinity: Affinity) -> None:
        self.batches = batches
        self.affinity = affinity
        self._openers: list[int] = []  # found as the hints move on (_find_openers), not all at start
        self._scanned = 0
        self._seen_blocks: set[tuple[int, int]] = set()
        self._next_opener = 0

    def _find_openers(self, end: int) -> None:
        """Positions of the first batch of each block in the list (what ``announce`` names), up to
        position ``end``: an epoch of millions of batches is scanned as the consumer reaches it."""
        end = min(end, len(self.batches))
        while self._scanned < end:
            b = self.batches[self._scanned]
            block = (b.epoch, self.affinity.block(b))
            if block not in self._seen_blocks:
                self._seen_blocks.add(block)
                self._openers.append(self._scanned)
            self._scanned += 1

    def announce(self, hint: dict[str, list[BatchId]], limit: int, owners: tuple[str, ...],
                 weights: tuple[float, ...]) -> None:
        """Add to ``hint`` (address -> batches) each owner's blocks that start within ``hint_ahead``
        places beyond ``limit`` (the bound of what is asked for), so its data arrives before the
        block's first batch is asked for."""
        horizon = limit + self.affinity.hint_ahead
        self._find_openers(horizon)
        while self._next_opener < len(self._openers) and self._openers[self._next_opener] < horizon:
            i = self._openers[self._next_opener]
            self._next_opener += 1
            if i >= limit and owners:  # nearer ones are asked for already, which starts their fetch too
                owner = cast(str, self.affinity.owner(self.batches[i], owners, weights))  # owners is not empty
                hint[owner].append(self.batches[i])
