"""Epoch plans: which sample indices make batch ``i`` of epoch ``e``.

Everything here is a pure function of (plan config, seed, epoch, index), so any
server, worker process or the in-process homogeneous loader computes the same
batches. The consumer never needs the permutation: it asks for (seed, epoch, i).

Two orders:

* a full shuffle (``block_samples=0``): batch ``i`` is a slice of one permutation of every sample;
* a block shuffle, for data read as large shards (``block_samples=S``): the samples are cut into
  fixed blocks of ``S`` consecutive indices (``S`` a multiple of the batch size, so a block holds
  whole batches); each epoch permutes the order of the blocks and, inside each block, its samples,
  then cuts each block into batches. Every batch draws from one block only, so a data node that
  builds it reads one contiguous stretch of the shards. Batches of ``interleave`` consecutive
  blocks alternate (block a's first batch, block b's first, ..., block a's second, ...), so the
  batches a consumer asks for at once belong to several blocks, which different data nodes own
  (``dnn_worker.fetch.affinity``). A partial last batch (``drop_last=False``) comes last in the epoch,
  as in the full shuffle.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class EpochShape:
    """The shape of every epoch of one pipeline.

    Args:
        num_samples: length of the map-style dataset.
        batch_size: samples per batch.
        drop_last: drop the last partial batch (True) or keep it (False).
        shuffle: permute the samples each epoch from (seed, epoch).
    """

    num_samples: int
    batch_size: int
    drop_last: bool = False
    shuffle: bool = True
    block_samples: int = 0
    interleave: int = 1

    def __post_init__(self) -> None:
        if self.block_samples:
            if (not isinstance(self.block_samples, int) or self.block_samples < self.batch_size
                    or self.block_samples % self.batch_size):
                raise ConfigError(f"block_samples={self.block_samples!r} must be a multiple of "
                                  f"batch_size={self.batch_size} (whole batches per shuffle block), or 0 for a "
                                  "full shuffle")
            if not isinstance(self.interleave, int) or self.interleave < 1:
                raise ConfigError(f"interleave={self.interleave!r} must be an int >= 1 (blocks whose batches "
                                  "alternate)")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size!r} must be an int >= 1")
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise ConfigError(f"num_samples={self.num_samples!r} must be >= 1: the dataset is empty")
        if self.drop_last and self.num_samples < self.batch_size:
            raise ConfigError(f"drop_last=True with num_samples={self.num_samples} < batch_size={self.batch_size} "
                              "leaves no batch; lower batch_size or set drop_last=False")

    @property
    def num_batches(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def num_blocks(self) -> int:
        """Shuffle blocks (1 for a full shuffle)."""
        return -(-self.num_samples // self.block_samples) if self.block_samples else 1


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers, stable across processes, hosts and Python runs."""
    digest = hashlib.blake2b(":".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@lru_cache(maxsize=4)
def _permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    # Cached per (seed, epoch): a server's workers see a few of those at a time (the epochs in
    # flight of one job), and a permutation of millions of samples takes milliseconds to draw.
    rng = np.random.Generator(np.random.PCG64(derive_seed(seed, epoch, 0xE90C)))
    return rng.permutation(num_samples).astype(np.int64)


def batch_indices(cfg: EpochShape, seed: int, epoch: int, index: int) -> list[int]:
    """Sample indices of batch ``index`` of epoch ``epoch``.

    Raises:
        IndexError: ``index`` or ``epoch`` is outside the plan.
    """
    if epoch < 0:
        raise IndexError(f"epoch={epoch} must be >= 0")
    if not 0 <= index < cfg.num_batches:
        raise IndexError(f"batch index={index} is outside the epoch: valid 0..{cfg.num_batches - 1}")
    start = index * cfg.batch_size
    if not cfg.shuffle:  # the identity: nothing to draw or cache, whatever the seed
        return list(range(start, min(start + cfg.batch_size, cfg.num_samples)))
    if cfg.block_samples:
        block, k = _block_order(cfg, seed, epoch)[index]
        first = int(block) * cfg.block_samples
        perm = _block_permutation(cfg.block_samples, cfg.num_samples, seed, epoch, int(block))
        return (perm[k * cfg.batch_size:(k + 1) * cfg.batch_size] + first).tolist()
    return _permutation(cfg.num_samples, seed, epoch)[start:start + cfg.batch_size].tolist()


def batch_block(cfg: EpochShape, seed: int, epoch: int, index: int) -> int:
    """The shuffle block batch ``index`` of ``epoch`` draws from (0 for a full shuffle).

    Raises:
        IndexError: ``index`` or ``epoch`` is outside the plan.
    """
    if epoch < 0 or not 0 <= index < cfg.num_batches:
        raise IndexError(f"epoch={epoch}, batch index={index} is outside the plan (0..{cfg.num_batches - 1})")
    if not cfg.block_samples:
        return 0
    if not cfg.shuffle:
        return index * cfg.batch_size // cfg.block_samples
    return int(_block_order(cfg, seed, epoch)[index][0])


class _BlockOrder:
    """(block, batch within the block) of every batch of one epoch, computed per batch.

    The epoch's blocks are a permutation; groups of ``interleave`` consecutive ones take turns
    (the k-th batch of every block of the group, then the (k+1)-th). Every group holds
    ``per_block`` batches of each block but the one holding the last block, which may be short:
    so where a batch lies is arithmetic, and nothing is held per batch (an epoch of 100 M samples
    has millions of batches; its order costs 8 bytes a block).
    """

    def __init__(self, cfg: EpochShape, seed: int, epoch: int) -> None:
        self.blocks = np.random.Generator(np.random.PCG64(derive_seed(seed, epoch, 0xB10C))).permutation(cfg.num_blocks)
        self.group = cfg.interleave
        self.last = cfg.num_blocks - 1
        self.per_block = cfg.block_samples // cfg.batch_size
        self.last_full = (cfg.num_samples - self.last * cfg.block_samples) // cfg.batch_size
        self.groups = -(-cfg.num_blocks // self.group)
        self.special = int(np.flatnonzero(self.blocks == self.last)[0]) // self.group  # the last block's group
        g = np.arange(self.groups + 1, dtype=np.int64)
        # batches before group g: per_block for each block, less what the last block lacks
        self.starts = self.per_block * np.minimum(g * self.group, len(self.blocks)) + \
            np.where(g > self.special, self.last_full - self.per_block, 0)
        self.rows = int(self.starts[-1])

    def __getitem__(self, index: int) -> tuple[int, int]:
        if index >= self.rows:  # the partial batch, kept: last in the epoch
            return self.last, self.last_full
        lo = int(np.searchsorted(self.starts, index, side="right")) - 1
        members = self.blocks[lo * self.group:(lo + 1) * self.group]
        r = index - int(self.starts[lo])
        if lo != self.special:
            return int(members[r % len(members)]), r // len(members)
        counts = [self.last_full if b == self.last else self.per_block for b in members]
        for k in range(max(counts)):
            turn = [int(b) for b, n in zip(members, counts) if k < n]
            if r < len(turn):
                return turn[r], k
            r -= len(turn)
        raise IndexError(index)


_block_order = lru_cache(maxsize=8)(_BlockOrder)


@lru_cache(maxsize=64)
def _block_permutation(block_samples: int, num_samples: int, seed: int, epoch: int, block: int) -> np.ndarray:
    size = min(block_samples, num_samples - block * block_samples)
    rng = np.random.Generator(np.random.PCG64(derive_seed(seed, epoch, block, 0xB10C)))
    return rng.permutation(size).astype(np.int64)


def rank_share(num_batches: int, rank: int, world_size: int, remainder: str = "drop") -> list[int]:
    """Batch indices one data-parallel rank consumes in an epoch, in order.

    Rank ``r`` takes batches r, r+R, r+2R, ... so step ``k`` of all ranks
    covers batches kR..kR+R-1. Every rank gets the same count, so DDP never
    waits on an uneven last step.

    Args:
        remainder: ``"drop"`` skips the last ``num_batches % world_size``
            batches; ``"pad"`` gives every rank ``ceil(num_batches / world_size)``
            batches by wrapping round to the first batches of the epoch.
    """
    per_rank = rank_share_size(num_batches, rank, world_size, remainder)
    return [(k * world_size + rank) % num_batches for k in range(per_rank)]


def rank_share_size(num_batches: int, rank: int, world_size: int, remainder: str = "drop") -> int:
    """How many batches ``rank_share`` gives each rank (its errors for bad arguments)."""
    if world_size < 1:
        raise ConfigError(f"world_size={world_size} must be >= 1")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank={rank} must be in 0..{world_size - 1} (world_size={world_size})")
    if remainder == "drop":
        per_rank = num_batches // world_size
    elif remainder == "pad":
        per_rank = -(-num_batches // world_size)
    else:
        raise ConfigError(f"remainder={remainder!r} must be 'drop' or 'pad'")
    if per_rank == 0:
        raise ConfigError(f"an epoch of {num_batches} batches is too short for world_size={world_size} with "
                          "remainder='drop'; use remainder='pad' or a smaller batch size")
    return per_rank
