"""``ResumableLoader``: a DataLoader wrapper whose state is as of the last batch it yielded.

    loader = ResumableLoader(DataLoader(RemoteDataset(...), batch_size=None, num_workers=2,
                                        persistent_workers=True, multiprocessing_context="forkserver"))
    loader.load_state_dict(torch.load(ckpt)["data"])      # resume, if a checkpoint exists
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            step(batch)
            if stopping:                                   # SIGTERM, spot interruption
                torch.save({"data": loader.state_dict(), ...}, ckpt)

What the DataLoader's workers prefetched but this wrapper did not yet yield is fetched again
after a resume, so no batch is repeated or skipped. Wrapped in more prefetching stages
(``DeviceFeeder``), checkpoint the outermost one: each reports its state as of the last batch
it yielded (docs/consumer.md). ``set_epoch`` and resume reach persistent workers too: the
dataset shares its epoch and resume point with them through shared memory.
"""
from __future__ import annotations

import weakref
from typing import Any, Iterator

from torch.utils.data import DataLoader

from data_service.contract.batch_id import BatchId
from data_service.errors import ConfigError

from .resume.audit import AuditedStage, digest, take_audit
from .resume.sharding import Deal, ShardedBatches
from .resume.state import LoadableState, ResumeState


class ResumableLoader(AuditedStage):
    """Args: loader: a DataLoader whose dataset is a ``RemoteDataset`` or ``LocalDataset``."""

    def __init__(self, loader: DataLoader) -> None:
        if not isinstance(loader.dataset, ShardedBatches):
            raise ConfigError(f"ResumableLoader needs a DataLoader over RemoteDataset/LocalDataset, "
                              f"got {type(loader.dataset).__name__}")
        self.loader = loader
        self.dataset: ShardedBatches = loader.dataset
        self.persistent = bool(loader.num_workers and getattr(loader, "persistent_workers", False))
        if loader.num_workers:
            self.dataset.share_with_workers(self.persistent)
        self._consumed = 0  # batches yielded since the dataset's resume point
        self.last_yielded: BatchId | None = None
        self._audit = take_audit(self.dataset)
        # A weak reference: the iteration refers to this loader, so a strong one back would make a
        # cycle that keeps a broken-off iteration (and its DataLoader workers) alive until the
        # cyclic collector runs. That collector stops the index queues' feeder threads before the
        # iteration's ``finally`` asks the workers to exit, so they never hear it and each costs
        # torch's 5 s join timeout. Held only by the caller's loop, the iteration ends with it.
        self._active: weakref.ref | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.resume_state().epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields; the current one keeps its position."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch={epoch!r} must be an int >= 0")
        if epoch != self.epoch:
            dealt = self.dataset.deal
            self.dataset.start_epoch(epoch)  # shared as usual: an epoch dealt on resuming is dealt no more
            self._consumed = 0
            self._restart_if_redealt(dealt)

    def __len__(self) -> int:
        """Batches left in the current epoch (all of the next one after a finished epoch)."""
        return len(self.dataset.rank_share()) - self.resume_state().position

    def __iter__(self) -> Iterator[Any]:
        self._close_active()  # an iteration left suspended (the loop broke off) ends here
        active = self._iterate()
        self._active = weakref.ref(active)
        return active

    def _close_active(self) -> None:
        active = self._active() if self._active is not None else None
        self._active = None
        if active is not None:
            active.close()

    def _iterate(self) -> Iterator[Any]:
        state = self.resume_state()
        self.dataset.seek(state.epoch, state.position)  # continue where the last iteration stopped
        self._consumed = 0
        seed, epoch, rank = self.dataset.seed, self.dataset.epoch, self.dataset.dp_rank
        indices = self.dataset.rank_indices()
        audit = self._audit
        it = iter(self.loader)
        complete = False
        try:
            for batch in it:
                which = BatchId(seed, epoch, indices[self._consumed])
                if audit is not None:
                    audit.write(which, rank, digest(batch))
                self._consumed += 1
                self.last_yielded = which
                yield batch
            complete = True
        finally:
            # Stop non-persistent workers when this iteration ends or is closed, not when the
            # iterator is collected: a traceback can keep it alive until the process exits, and
            # workers that ignore SIGTERM (the launcher's) would then hold the exit forever.
            if not self.persistent:
                _shutdown(it)
        if complete:  # a checkpoint taken now resumes at the next epoch
            self.dataset.seek(epoch + 1, 0)
            self._consumed = 0

    def close(self) -> None:
        """Stop the loader's (persistent) workers now; the next iteration starts new ones."""
        self._close_active()
        _shutdown(getattr(self.loader, "_iterator", None))
        if self.persistent:
            self.loader._iterator = None

    def state_dict(self) -> dict[str, Any]:
        """Where to resume, as of the last batch this loader yielded (see ``ShardedBatches.state_dict``)."""
        return self.resume_state().to_dict()

    def resume_state(self) -> ResumeState:
        """:meth:`state_dict` as the typed value."""
        return self.dataset.resume_state_at(self.dataset.epoch, self.dataset.start + self._consumed)

    def load_state_dict(self, state: LoadableState) -> None:
        """Resume there: this rank's state, or every rank's (a list) from another number of ranks."""
        dealt = self.dataset.deal
        self.dataset.load_state_dict(state)
        self._consumed = 0
        self._restart_if_redealt(dealt)

    def _restart_if_redealt(self, dealt: Deal | None) -> None:
        """Stop persistent workers that hold a copy of the dataset made under deal ``dealt``, another
        than the dataset's now: the epoch and resume point reach them through shared memory, the
        deal does not, and they would yield another share than the one this loader audits."""
        if self.dataset.deal != dealt and self.persistent and self.loader._iterator is not None:
            self.close()


def _shutdown(it: Any) -> None:
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
