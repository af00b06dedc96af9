"""Which batches one consumer process yields: rank share, loader-worker split, resume point, audit."""
from __future__ import annotations

import json
import os
from typing import Any, Iterator

import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from data_service.codec import batch_digest
from data_service.errors import ConfigError
from data_service.sampler import rank_share


def default_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else torch.distributed's when it is initialised, else (0, 1)."""
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        else:
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
    return rank, world_size


class ShardedBatches(IterableDataset):
    """Base of ``RemoteDataset`` and ``LocalDataset``: same share, same order, same audit.

    Args:
        seed: the job's seed; with the epoch it fixes every batch's samples and augmentation.
        rank, world_size: this consumer's data-parallel position (default: torch.distributed).
        dp_rank, dp_size: data-parallel position when it differs from the global rank
            (tensor/pipeline parallelism: all ranks that hold the same dp_rank see the same
            batches). Or pass ``dp_group``, a torch.distributed process group spanning one rank
            per data-parallel replica (its rank and size are used).
        remainder: "drop" or "pad" when batches do not divide evenly among ranks.
        audit_path: append one JSON line per yielded batch: epoch, batch, rank, sha256.
    """

    def __init__(self, *, seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 dp_rank: int | None = None, dp_size: int | None = None, remainder: str = "drop",
                 audit_path: str | os.PathLike | None = None, dp_group: Any = None) -> None:
        super().__init__()
        if dp_group is not None:
            if dp_rank is not None or dp_size is not None:
                raise ConfigError("give dp_group or dp_rank/dp_size, not both")
            dp_rank, dp_size = dist.get_rank(dp_group), dist.get_world_size(dp_group)
        if not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"seed={seed!r} must be an int >= 0")
        self.seed = seed
        self.rank, self.world_size = default_rank_world(rank, world_size)
        if (dp_rank is None) != (dp_size is None):
            raise ConfigError(f"give dp_rank and dp_size together (got dp_rank={dp_rank}, dp_size={dp_size})")
        self.dp_rank = self.rank if dp_rank is None else dp_rank
        self.dp_size = self.world_size if dp_size is None else dp_size
        if remainder not in ("drop", "pad"):
            raise ConfigError(f"remainder={remainder!r} must be 'drop' or 'pad'")
        if not 0 <= self.dp_rank < self.dp_size:
            raise ConfigError(f"dp_rank={self.dp_rank} must be in 0..{self.dp_size - 1}")
        self.remainder = remainder
        self.audit_path = os.fspath(audit_path) if audit_path is not None else None
        self.epoch = 0
        self.start = 0  # batches of this rank's share already consumed (resume)

    # -- epoch and resume
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields (like DistributedSampler.set_epoch)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch={epoch!r} must be an int >= 0")
        if epoch != self.epoch:
            self.start = 0
        self.epoch = epoch

    def state_dict(self, consumed: int = 0) -> dict[str, Any]:
        """Where to resume.

        Args:
            consumed: batches the training loop consumed since this epoch's iteration began
                (``ResumableLoader`` counts them for you).

        Returns:
            epoch, seed, position (batches of this rank's share already consumed), dp_rank, dp_size.
        """
        return {"epoch": self.epoch, "seed": self.seed, "position": self.start + consumed,
                "dp_rank": self.dp_rank, "dp_size": self.dp_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the next unseen batch of ``state["epoch"]`` (no batch repeated or skipped)."""
        if state.get("seed", self.seed) != self.seed:
            raise ConfigError(f"checkpoint seed={state['seed']} differs from seed={self.seed}; resume with the same seed")
        if state.get("dp_size", self.dp_size) != self.dp_size:
            raise ConfigError(f"checkpoint was taken with dp_size={state['dp_size']}, this job has "
                              f"dp_size={self.dp_size}; resume with the same number of data-parallel ranks")
        self.epoch = int(state["epoch"])
        self.start = int(state["position"])

    # -- shares
    def num_batches_per_epoch(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def rank_indices(self) -> list[int]:
        """This rank's batch indices for the current epoch, after the resume point."""
        return rank_share(self.num_batches_per_epoch(), self.dp_rank, self.dp_size, self.remainder)[self.start:]

    def my_indices(self) -> list[int]:
        """This process's part: DataLoader worker ``w`` of ``N`` takes every N-th batch from w,
        so the loader's round-robin yields them in order."""
        indices = self.rank_indices()
        info = get_worker_info()
        if info is not None and info.num_workers > 1:
            indices = indices[info.id::info.num_workers]
        return indices

    def __len__(self) -> int:
        return len(self.rank_indices())

    # -- audit
    def _audited(self, pairs: Iterator[tuple[int, Any]], path: str | None = None) -> Iterator[Any]:
        path = path or self.audit_path
        if path is None:
            for _, batch in pairs:
                yield batch
            return
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for index, batch in pairs:
                line = json.dumps({"epoch": self.epoch, "batch": index, "rank": self.dp_rank,
                                   "sha256": batch_digest(batch)}) + "\n"
                os.write(fd, line.encode())  # one O_APPEND write per line: atomic across processes
                yield batch
        finally:
            os.close(fd)


