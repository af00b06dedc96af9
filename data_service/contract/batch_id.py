"""Which batch: one value from a consumer's list to a server's window; a protocol message only on the wire.

Given the pipeline, a batch is a pure function of (seed, epoch, index) (``sampler``), so those three
name it everywhere: a consumer's list and its scheduler's queues, the audit, a server's requests,
builds and window. ``pb.BatchRef`` is made from a ``BatchId``, and read back into one, only where a
frame is written or parsed (:meth:`BatchId.ref`, :meth:`BatchId.of`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..protocol.generated import pb


@dataclass(frozen=True, slots=True)
class BatchId:
    """Batch ``index`` of epoch ``epoch`` of the plan seeded by ``seed``; hashable, so it keys dicts and sets."""

    seed: int
    epoch: int
    index: int

    @classmethod
    def of(cls, ref: pb.BatchRef) -> "BatchId":
        """The batch a frame's ``BatchRef`` names."""
        return cls(ref.seed, ref.epoch, ref.index)

    def ref(self) -> pb.BatchRef:
        """This batch as the protocol's message, for a frame."""
        return pb.BatchRef(seed=self.seed, epoch=self.epoch, index=self.index)

    def __str__(self) -> str:
        return f"epoch {self.epoch} batch {self.index}"
