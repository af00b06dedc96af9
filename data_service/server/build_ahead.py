"""Which batches a data server with a batch window builds before any job asks: the next epoch's first.

Jobs of a sweep that read one seed in step reach an epoch's end together. Their last requests
are built, and then the node's workers idle until the jobs have trained on what they hold and
ask for the next epoch. A batch is a pure function of (pipeline, seed, epoch, index), and a job
takes its epochs in order, so once the last ``lead`` batches of an epoch have been asked for, the
server builds the first ``lead`` batches of the next epoch on workers that would otherwise idle,
into the window, where the jobs' first requests of that epoch find them. It pays where epochs are
short (4 jobs, epochs of 32 batches: 1.07x the images/s; of 128: no change; docs/benchmarks.md).

What it costs: a batch built ahead that no job asks of this server (every job stops at that
epoch, or, with several data nodes, a job asks that batch of another node) is one build on a
worker that had nothing else to do; a request that arrives while every worker builds ahead
waits for one build at most. ``ServerOptions.build_ahead = 0`` turns it off.

``AheadPlan`` only decides (no I/O, no lock: its owner, shared_builds.SharedBuilds, calls it
under its own).
"""
from __future__ import annotations

import collections

from ..contract.batch_id import BatchId

SEEDS_KEPT = 64  # seeds followed at once (the most recently asked); a sweep has a few


class AheadPlan:
    """Per seed, the furthest batch asked for, and which of the next epoch's batches are due.

    Args:
        num_batches: batches per epoch.
        lead: batches of the next epoch built ahead, once the last ``lead`` of this one are asked
            for (0: none).
    """

    def __init__(self, num_batches: int, lead: int) -> None:
        if num_batches < 0 or lead < 0:
            raise ValueError(f"num_batches={num_batches} and lead={lead} must be >= 0")
        self.num_batches = num_batches
        self.lead = min(lead, num_batches)
        self._front: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self._started: dict[int, tuple[int, int]] = {}  # seed -> (epoch, next index to start) of its epoch ahead

    def asked(self, batch: BatchId) -> None:
        """A job asked for ``batch``."""
        if self.lead == 0:
            return
        at = (batch.epoch, batch.index)
        self._front[batch.seed] = max(self._front.get(batch.seed, at), at)
        self._front.move_to_end(batch.seed)
        while len(self._front) > SEEDS_KEPT:
            old, _ = self._front.popitem(last=False)
            self._started.pop(old, None)

    def due(self) -> list[BatchId]:
        """The batches to build ahead now, in the order to build them: for each seed whose furthest
        request is among its epoch's last ``lead``, the next epoch's first ``lead`` batches not yet started."""
        out: list[BatchId] = []
        for seed, (epoch, index) in self._front.items():
            if index < self.num_batches - self.lead:
                continue
            started_epoch, start = self._started.get(seed, (epoch + 1, 0))
            if started_epoch != epoch + 1:
                start = 0
            out.extend(BatchId(seed, epoch + 1, i) for i in range(start, self.lead))
        return out

    def started(self, batch: BatchId) -> None:
        """The build of ``batch``, from ``due``, was started (or was not needed)."""
        self._started[batch.seed] = (batch.epoch, batch.index + 1)
