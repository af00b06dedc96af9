"""``ResumableLoader``: a DataLoader wrapper that knows how far the training loop got.

    loader = ResumableLoader(DataLoader(RemoteDataset(...), batch_size=None, num_workers=2))
    loader.load_state_dict(torch.load(ckpt)["data"])      # resume, if a checkpoint exists
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            step(batch)
            if stopping:                                   # SIGTERM, spot interruption
                torch.save({"data": loader.state_dict(), ...}, ckpt)

Only batches the loop received count: what the DataLoader prefetched but the loop never saw is
fetched again after a resume, so no batch is repeated or skipped. For the same reason the
dataset's audit log is written here, as the loop receives each batch, not where it was fetched.
"""
from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader

from data_service.errors import ConfigError

from .sharding import ShardedBatches


class ResumableLoader:
    """Args: loader: a DataLoader whose dataset is a ``RemoteDataset`` or ``LocalDataset``."""

    def __init__(self, loader: DataLoader) -> None:
        if not isinstance(loader.dataset, ShardedBatches):
            raise ConfigError(f"ResumableLoader needs a DataLoader over RemoteDataset/LocalDataset, "
                              f"got {type(loader.dataset).__name__}")
        if getattr(loader, "persistent_workers", False):
            raise ConfigError("persistent_workers=True keeps each worker's copy of the dataset, so set_epoch and "
                              "resume would not reach it; use persistent_workers=False")
        self.loader = loader
        self.dataset: ShardedBatches = loader.dataset
        self._consumed = 0
        # Audit what the loop consumes, not what the loader's workers prefetched.
        self.audit_path, self.dataset.audit_path = self.dataset.audit_path, None

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.dataset.epoch:
            self._consumed = 0
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[Any]:
        self._consumed = 0
        it = iter(self.loader)
        batches: Iterator[Any] = it
        if self.audit_path is not None:
            indices = self.dataset.rank_indices()
            batches = self.dataset._audited(zip(indices, batches), self.audit_path)
        try:
            for batch in batches:
                self._consumed += 1
                yield batch
        finally:
            # Stop the loader's workers when this iteration ends or is closed, not when the
            # iterator is collected: a traceback can keep it alive until the process exits, and
            # workers that ignore SIGTERM (the launcher's) would then hold the exit forever.
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        # The epoch is complete: a checkpoint taken now resumes at the next epoch.
        self.dataset.start = 0
        self._consumed = 0
        self.dataset.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict(consumed=self._consumed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
        self._consumed = 0
