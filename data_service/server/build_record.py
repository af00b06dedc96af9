"""Which batches a data server has built, per (seed, epoch): so a build of one it built before is
counted as built again (its copy had left the batch window, or a job asked for it once more)."""
from __future__ import annotations

import collections

from ..contract.batch_id import BatchId

EPOCHS_KEPT = 64  # (seed, epoch) pairs remembered, the most recently built; older ones are forgotten


class BuildRecord:
    """One bit per batch of each (seed, epoch) pair built lately.

    Args:
        num_batches: batches per epoch of the plan (the bitmaps' length).
        epochs_kept: (seed, epoch) pairs remembered; a build of an older pair counts as a first build.
    """

    def __init__(self, num_batches: int, epochs_kept: int = EPOCHS_KEPT) -> None:
        if num_batches < 0 or epochs_kept < 1:
            raise ValueError(f"num_batches={num_batches} must be >= 0 and epochs_kept={epochs_kept} >= 1")
        self.num_batches = num_batches
        self.epochs_kept = epochs_kept
        self._bits: collections.OrderedDict[tuple[int, int], bytearray] = collections.OrderedDict()

    def built(self, batch: BatchId) -> bool:
        """Note a build of ``batch``; True when it had been built before."""
        pair, index = (batch.seed, batch.epoch), batch.index
        bits = self._bits.get(pair)
        if bits is None:
            bits = self._bits[pair] = bytearray((self.num_batches + 7) // 8)
            while len(self._bits) > self.epochs_kept:
                self._bits.popitem(last=False)
        else:
            self._bits.move_to_end(pair)
        if not 0 <= index < self.num_batches:
            return False
        byte, bit = divmod(index, 8)
        before = bool(bits[byte] >> bit & 1)
        bits[byte] |= 1 << bit
        return before
