"""Each block's prefetch triggered once per epoch on a data node, whatever names the block first.

A consumer names a batch twice: in a hint (a batch it will ask for soon) and in its request. Both
come to :meth:`PrefetchOnce.batch` on the data plane's loop thread; the batch's blocks (the
prefetcher's ``block_samples``) are handed to the pipeline's :class:`~data_service.contract.pipeline.BlockPrefetcher`
the first time any consumer names them in that epoch, and never again in it. The last
``EPOCHS_KEPT`` (seed, epoch) pairs are remembered, so ranks a little apart in their epochs share
the memory, and a later epoch fetches a block again if the node's cache let it go.
"""
from __future__ import annotations

import collections
import logging

from ..contract.batch_id import BatchId
from ..contract.pipeline import BlockPrefetcher
from ..contract.sampler import EpochShape, batch_indices

log = logging.getLogger(__name__)

EPOCHS_KEPT = 4


class PrefetchOnce:
    """Hands each block of ``plan`` to ``prefetcher`` once per (seed, epoch); see the module docstring."""

    def __init__(self, prefetcher: BlockPrefetcher, plan: EpochShape) -> None:
        if not isinstance(prefetcher.block_samples, int) or prefetcher.block_samples < 1:
            raise ValueError(f"prefetcher.block_samples={prefetcher.block_samples!r} must be an integer >= 1")
        self.prefetcher = prefetcher
        self.plan = plan
        self.triggered = 0  # blocks handed to the prefetcher
        # (seed, epoch) -> (batches seen, blocks triggered), oldest first
        self._epochs: collections.OrderedDict[tuple[int, int], tuple[set[int], set[int]]] = \
            collections.OrderedDict()

    def batch(self, which: BatchId) -> None:
        """A consumer named the batch ``which``: trigger its blocks not triggered yet."""
        key = (which.seed, which.epoch)
        seen = self._epochs.get(key)
        if seen is None:
            seen = self._epochs[key] = (set(), set())
            while len(self._epochs) > EPOCHS_KEPT:
                self._epochs.popitem(last=False)
        else:
            self._epochs.move_to_end(key)
        batches, blocks = seen
        if which.index in batches:
            return
        batches.add(which.index)
        try:
            indices = batch_indices(self.plan, which.seed, which.epoch, which.index)
        except IndexError:
            return  # outside the plan: the request is refused elsewhere
        size = self.prefetcher.block_samples
        for block in sorted({int(i) // size for i in indices} - blocks):
            blocks.add(block)
            self.triggered += 1
            try:
                self.prefetcher.prefetch_block(block)
            except Exception as exc:  # a hint only: the worker that builds the batch reports real errors
                log.debug("prefetch of block %d (epoch %d): %s", block, which.epoch, exc)
