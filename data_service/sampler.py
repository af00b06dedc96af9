"""Epoch plans: which sample indices make batch ``i`` of epoch ``e``.

Everything here is a pure function of (plan config, seed, epoch, index), so any
server, worker process or the in-process homogeneous loader computes the same
batches. The consumer never needs the permutation: it asks for (seed, epoch, i).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import ConfigError


@dataclass(frozen=True)
class PlanConfig:
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

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size!r} must be an int >= 1")
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise ConfigError(f"num_samples={self.num_samples!r} must be >= 1: the dataset is empty")
        if self.drop_last and self.num_samples < self.batch_size:
            raise ConfigError(
                f"drop_last=True with num_samples={self.num_samples} < batch_size={self.batch_size} "
                "leaves no batch; lower batch_size or set drop_last=False"
            )

    @property
    def num_batches(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)


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


def batch_indices(cfg: PlanConfig, seed: int, epoch: int, index: int) -> list[int]:
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
    perm = _permutation(cfg.num_samples, seed, epoch)
    return perm[start:start + cfg.batch_size].tolist()


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
        raise ConfigError(
            f"an epoch of {num_batches} batches is too short for world_size={world_size} with "
            "remainder='drop'; use remainder='pad' or a smaller batch size"
        )
    return [(k * world_size + rank) % num_batches for k in range(per_rank)]
