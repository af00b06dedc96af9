"""Which batches one consumer process yields: rank share, loader-worker split, resume point, audit."""
from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from data_service.contract.batch_id import BatchId
from data_service.errors import ConfigError

from .audit import AuditLog, digest
from .batch_list import BatchList, rank_stride
from .resharding import dealt_share, merge
from .state import EarlierWorld, LoadableState, Remainder, ResumeState

Deal = tuple[int, tuple[EarlierWorld, ...]]  # an epoch dealt again, and the worlds that trained part of it


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
        audit_path: append one JSON line per yielded batch: epoch, batch, rank, sha256 (written
            by the outermost consumer stage; see ``dnn_worker.resume.audit``).
        epochs: the epochs training will run (0 .. epochs-1), when known: enables ``lookahead``.
        lookahead: at the end of an epoch before the last, fetch this many of the next epoch's
            first batches (per loader worker) while the last ones train, so an epoch boundary
            costs no wait. Used by the next iteration when it starts the next epoch from its
            beginning (the usual loop), dropped otherwise; 0 turns it off.

    Iterating yields the rest of the current epoch from the resume point; a finished iteration
    moves to the next epoch. ``state_dict()`` is as of the last batch yielded.
    """

    def __init__(self, *, seed: int = 0, rank: int | None = None, world_size: int | None = None,
                 dp_rank: int | None = None, dp_size: int | None = None, remainder: str = "drop",
                 audit_path: str | os.PathLike | None = None, dp_group: Any = None, epochs: int | None = None,
                 lookahead: int = 4) -> None:
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
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise ConfigError(f"epochs={epochs!r} must be an int >= 1 (or None: not known)")
        if not isinstance(lookahead, int) or lookahead < 0:
            raise ConfigError(f"lookahead={lookahead!r} must be an int >= 0")
        Remainder.parse(remainder)
        if not 0 <= self.dp_rank < self.dp_size:
            raise ConfigError(f"dp_rank={self.dp_rank} must be in 0..{self.dp_size - 1}")
        self.remainder = remainder
        self.audit_path = os.fspath(audit_path) if audit_path is not None else None
        self.epoch = 0
        self.start = 0  # batches of this rank's share before the next iteration's first one
        self._yielded = 0  # batches this object's own iteration yielded since ``start``
        self.last_yielded: BatchId | None = None
        self._share: tuple[tuple, Sequence[int]] | None = None
        # (epoch, earlier worlds) of an epoch resumed on another number of ranks (``resharding``)
        self._dealt: Deal | None = None
        # [epoch, start] in shared memory, read by DataLoader workers at each iteration: a
        # persistent worker keeps its copy of this object, so plain attributes would not reach it.
        self._plan = None
        self.epochs = epochs
        self.lookahead = lookahead
        self._workers_persist = False  # may a loader worker keep ``_carry`` (``share_with_workers``)?
        self._carry: dict[BatchId, Any] = {}

    # -- epoch and resume (the consumer stage contract; see docs/consumer.md)
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields (like DistributedSampler.set_epoch).

        The same epoch as the current state keeps the position (a resumed epoch continues).
        """
        if not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"epoch={epoch!r} must be an int >= 0")
        if epoch != self.resume_state().epoch:
            self.start_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this object's next iteration starts: as of the last batch it yielded.

        Returns:
            :meth:`ResumeState.to_dict`: version, epoch, seed, position (batches of this rank's share
            already yielded), dp_rank, dp_size, and earlier_worlds in an epoch dealt again. A
            finished epoch reads as position 0 of the next one.
        """
        return self.resume_state().to_dict()

    def resume_state(self) -> ResumeState:
        """:meth:`state_dict` as the typed value."""
        return self.resume_state_at(self.epoch, self.start + self._yielded)

    def resume_state_at(self, epoch: int, position: int) -> ResumeState:
        """The state after ``position`` batches of ``epoch`` (wrapping stages report through this)."""
        if position and position >= len(self._share_of(epoch)):
            epoch, position = epoch + 1, 0
        return ResumeState(epoch=epoch, seed=self.seed, position=position, dp_rank=self.dp_rank,
                           dp_size=self.dp_size, earlier_worlds=self.earlier_worlds(epoch) or ())

    def earlier_worlds(self, epoch: int) -> tuple[EarlierWorld, ...] | None:
        """The worlds that trained part of ``epoch`` before it was dealt to this job's ranks, if it was."""
        return self._dealt[1] if self._dealt is not None and self._dealt[0] == epoch else None

    @property
    def deal(self) -> "Deal | None":
        """(epoch, earlier worlds) of the epoch resumed on another number of ranks, if one is: a
        loader worker's copy made under another deal yields another share."""
        return self._dealt

    def load_state_dict(self, state: LoadableState) -> None:
        """Resume at the next unseen batch of ``state["epoch"]`` (no batch repeated or skipped).

        ``state`` is this rank's ``state_dict()``, or a list of every rank's from a job with
        another number of data-parallel ranks: the rest of its epoch is then dealt to this job's
        ranks (``dnn_worker.resume.resharding``), each the same count.
        """
        parsed = merge(state, self.remainder) if isinstance(state, (list, tuple)) else ResumeState.from_dict(state)
        if parsed.seed is not None and parsed.seed != self.seed:
            raise ConfigError(f"checkpoint seed={parsed.seed} differs from seed={self.seed}; resume with the same seed")
        if parsed.dp_size is not None and parsed.dp_size != self.dp_size:
            raise ConfigError(f"checkpoint was taken with dp_size={parsed.dp_size}, this job has "
                              f"dp_size={self.dp_size}; pass every rank's state (a list) to deal the rest of the "
                              "epoch to this job's ranks (dnn_worker.resume.resharding), or resume with the same number "
                              "of data-parallel ranks")
        epoch, position = parsed.epoch, parsed.position
        before, self._dealt = self._dealt, ((epoch, parsed.earlier_worlds) if parsed.dealt else None)
        try:  # checked now, not at the first state_dict() or batch: the share checks each earlier world's positions
            share = len(self._share_of(epoch))
            if position > share:
                raise ConfigError(
                    f"the checkpoint is at position={position} of epoch {epoch}, past this rank's share of {share} "
                    f"batches (dp_rank {self.dp_rank} of {self.dp_size}, {self.num_batches_per_epoch()} batches an "
                    "epoch): it was taken with another data set, batch_size, drop_last or remainder; resume with "
                    "those of the job that wrote it, or start afresh without the checkpoint")
        except BaseException:
            self._dealt = before
            raise
        self.seek(epoch, position)

    def start_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``, shared among this job's ranks as usual (a deal ends)."""
        self._dealt = None
        self.seek(epoch, 0)

    def seek(self, epoch: int, position: int) -> None:
        """The next iteration starts after ``position`` batches of this rank's share of ``epoch``
        (loader workers too, once ``share_with_workers`` was called)."""
        self.epoch, self.start, self._yielded = epoch, position, 0
        if self._plan is not None:
            self._plan[0], self._plan[1] = epoch, position

    def share_with_workers(self, persistent: bool) -> None:
        """Let DataLoader workers follow ``set_epoch`` and resume; ``persistent``: they live across
        epochs, so each may keep the next epoch's first batches it fetched ahead (``lookahead``)."""
        self._workers_persist = persistent
        if self._plan is None:
            import torch

            self._plan = torch.tensor([self.epoch, self.start], dtype=torch.int64).share_memory_()

    # -- shares
    def num_batches_per_epoch(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def rank_share(self) -> Sequence[int]:
        """This rank's batch indices of the current epoch, all of them (the resume point aside)."""
        return self._share_of(self.epoch)

    def _share_of(self, epoch: int) -> Sequence[int]:
        """This rank's batches of ``epoch``: every R-th from its rank, or its part of what an
        epoch resumed on another number of ranks had left."""
        n = self.num_batches_per_epoch()
        worlds = self.earlier_worlds(epoch)
        key = (n, (epoch, repr(worlds)) if worlds is not None else None)
        if self._share is None or self._share[0] != key:
            share = (dealt_share(n, worlds, self.dp_rank, self.dp_size, self.remainder) if worlds is not None
                     else rank_stride(n, self.dp_rank, self.dp_size, self.remainder))
            self._share = (key, share)
        return self._share[1]

    def rank_indices(self) -> Sequence[int]:
        """This rank's batch indices for the current epoch, after the resume point."""
        return self.rank_share()[self.start:]

    def my_indices(self) -> Sequence[int]:
        """This process's part: DataLoader worker ``w`` of ``N`` takes every N-th batch from w,
        so the loader's round-robin yields them in order."""
        indices = self.rank_indices()
        info = get_worker_info()
        if info is not None and info.num_workers > 1:
            indices = indices[info.id::info.num_workers]
        return indices

    def __len__(self) -> int:
        return len(self.rank_indices())

    # -- iteration
    def _batches(self, items: BatchList) -> Iterator[tuple[BatchId, Any]]:  # pragma: no cover
        """Yield ``(batch id, batch)`` for ``items`` (computed per item: an epoch may hold millions), in order."""
        raise NotImplementedError

    def _next_epoch_items(self, epoch: int) -> BatchList:
        """This process's first ``lookahead`` batches of ``epoch + 1`` from its start (the usual next
        iteration), or none when no later iteration of this object can use them."""
        info = get_worker_info()
        if self.lookahead < 1 or self.epochs is None or epoch + 1 >= self.epochs:
            return BatchList(self.seed)
        if info is not None and not self._workers_persist:
            return BatchList(self.seed)  # a non-persistent loader worker ends with this epoch
        share = self._share_of(epoch + 1)
        if info is not None and info.num_workers > 1:
            share = share[info.id::info.num_workers]
        return BatchList(self.seed, [(epoch + 1, share[:self.lookahead])])

    def __iter__(self) -> Iterator[Any]:
        in_worker = get_worker_info() is not None
        if in_worker:
            if self._plan is not None:  # the main process's ResumableLoader decides
                self.epoch, self.start = int(self._plan[0]), int(self._plan[1])
        else:  # start where the last iteration stopped (or the next epoch after a finished one)
            state = self.resume_state()
            self.seek(state.epoch, state.position)
        epoch = self.epoch
        items = BatchList(self.seed, [(epoch, self.my_indices())])
        # Batches of this epoch fetched ahead at the end of the last one (its first, usually).
        carry, self._carry = self._carry, {}
        ready = 0
        while ready < len(items) and items[ready] in carry:
            ready += 1
        ahead = self._next_epoch_items(epoch)
        audit = AuditLog(self.audit_path) if self.audit_path else None
        complete = False
        try:
            produced = self._batches(items[ready:] + ahead) if ready < len(items) or ahead else iter(())
            sources = ((b, carry.pop(b)) for b in items[:ready])
            for source in (sources, produced):
                for which, batch in source:
                    if which.epoch != epoch:  # the next epoch's first batches: kept for the next iteration
                        self._carry[which] = batch
                        continue
                    if audit is not None:
                        audit.write(which, self.dp_rank, digest(batch))
                    self._yielded += 1
                    self.last_yielded = which
                    yield batch
            complete = True
        finally:
            if audit is not None:
                audit.close()
            if not complete:
                self._carry = {}
        if complete and not in_worker:
            self.seek(epoch + 1, 0)
