"""Which data server should build a batch: the one that owns the batch's shuffle block.

With a block shuffle (``data_service.contract.sampler``) every batch draws from one block of consecutive
samples, which a data node reading shards fetches whole into its cache. Asking for all of a
block's batches from one server means each block is read from storage by one node per epoch, and
by the same node every epoch (its cache then serves the later ones).

Owners come from rendezvous (highest-random-weight) hashing of (pipeline fingerprint, server
address, block) over the servers that are up: every consumer and every rank, given the same server
list, picks the same owner without talking to the others; when a server goes away only its blocks
move (each to the server that ranked second for it), and when one comes back it gets the same
blocks again. Servers of unequal size get blocks in proportion to a weight every consumer knows
alike (their worker processes, from their Hello): weighted rendezvous hashing, where a server's
score for a block is ``-weight / ln(u)`` with ``u`` its uniform hash; equal weights give the same
owners as the plain hash.
"""
from __future__ import annotations

import hashlib
import math

from data_service.contract.batch_id import BatchId
from data_service.contract.sampler import EpochShape, batch_block
from data_service.protocol.generated import pb


def _weight(salt: bytes, server: str, block: int) -> int:
    return int.from_bytes(hashlib.blake2b(b"%s|%s|%d" % (salt, server.encode(), block), digest_size=8).digest(),
                          "little")


def rendezvous_owner(block: int, servers, salt: str = "", weights=None) -> str:
    """The server of ``servers`` (non-empty) with the highest score for ``block``; with ``weights``
    (one positive number per server, in the same order) each wins blocks in proportion to its weight."""
    key = salt.encode()
    if weights is None or len(set(weights)) <= 1:
        return max(servers, key=lambda s: (_weight(key, s, block), s))
    scores = {}
    for s, w in zip(servers, weights):
        u = (_weight(key, s, block) + 0.5) / 2.0 ** 64
        scores[s] = (-w / math.log(u), s)
    return max(scores, key=scores.__getitem__)


class Affinity:
    """Block and owner of each batch of one pipeline's plan.

    Args:
        info: the servers' ``DatasetInfo`` (its ``block_samples`` must be > 0).
    """

    def __init__(self, info: pb.DatasetInfo) -> None:
        self.cfg = EpochShape(int(info.num_samples), int(info.batch_size), bool(info.drop_last), bool(info.shuffle),
                              int(info.block_samples), int(info.interleave) or 1)
        self.salt = info.fingerprint
        # Blocks starting this many places beyond what the consumer asks for are announced to their
        # owners (a group of interleaved blocks: the next group's data arrives before it is reached).
        self.hint_ahead = self.cfg.interleave * max(1, self.cfg.block_samples // self.cfg.batch_size)
        self._blocks: dict[BatchId, int] = {}
        self._owners: dict[tuple[int, tuple[str, ...], tuple[float, ...] | None], str] = {}

    @classmethod
    def of(cls, info: pb.DatasetInfo) -> "Affinity | None":
        """An Affinity when the plan shuffles by blocks, else None (any server is as good as another)."""
        return cls(info) if info.block_samples else None

    def block(self, batch: BatchId) -> int:
        b = self._blocks.get(batch)
        if b is None:
            if len(self._blocks) > 1 << 16:
                self._blocks.clear()
            b = self._blocks[batch] = batch_block(self.cfg, batch.seed, batch.epoch, batch.index)
        return b

    def owner(self, batch: BatchId, live: tuple[str, ...], weights: tuple[float, ...] | None = None) -> str | None:
        """The address that should build ``batch`` among ``live`` (None when none is), each server
        weighted by ``weights`` (aligned with ``live``; None: equal)."""
        if not live:
            return None
        block = self.block(batch)
        key = (block, live, weights)
        o = self._owners.get(key)
        if o is None:
            if len(self._owners) > 1 << 16:
                self._owners.clear()
            o = self._owners[key] = rendezvous_owner(block, live, self.salt, weights)
        return o
