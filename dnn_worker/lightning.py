"""LightningDataModules over ``RemoteDataset`` / ``LocalDataset`` (needs ``pip install lightning``).

For training code written for PyTorch Lightning, single node or multi-node DDP on SageMaker::

    dm = RemoteDataModule(["algo-1:6000"], token=token, seed=0, loader_workers=2)
    trainer = lightning.Trainer(max_epochs=3, strategy="ddp", num_nodes=2, ...)
    trainer.fit(model, datamodule=dm, ckpt_path="last")     # resumes mid-epoch, exactly

The module shards by Lightning's global rank itself (Lightning adds no DistributedSampler to
it), keeps its loader workers and their connections across epochs, and saves its data position
in Lightning's own checkpoint (``state_dict``/``load_state_dict`` hooks). Lightning fetches one
batch ahead of the step, so the position is taken when a batch reaches the step
(``on_before_batch_transfer``), not when the loader yields it: a checkpoint written at any step
resumes at the next untrained batch. DDP ranks step together, so rank 0's position (the one
Lightning saves) holds for every rank; resumed with another number of devices or nodes, the rest
of the epoch is dealt to the new ranks (``dnn_worker.resume.resharding``).
"""
from __future__ import annotations

import atexit
import collections
import functools
from typing import Any, Iterator, Sequence, cast

import torch.distributed as dist
from torch.utils.data import DataLoader

try:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.model_helpers import is_overridden
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise ImportError("dnn_worker.lightning needs PyTorch Lightning: pip install "
                      "'hetero-data-service[lightning]'") from exc

from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec

from .resume.audit import AuditLog, digest, take_audit
from .loader import ResumableLoader
from .local_dataset import LocalDataset
from .remote_dataset import RemoteDataset
from .resume.resharding import lockstep_states, steps_before_deal
from .resume.sharding import ShardedBatches
from .resume.state import ResumeState


@functools.cache
def _destroy_gloo_group_at_exit() -> None:
    """Destroy a gloo process group still open when the interpreter exits.

    Lightning leaves the group it made to the end of the process; gloo's threads, never joined
    then, abort it (``terminate called without an active exception``, exit code -6) at random,
    which fails the job. atexit runs while the interpreter can still join them. NCCL groups are
    left alone: their teardown may wait on peers.
    """
    def destroy() -> None:
        if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
            dist.destroy_process_group()
    atexit.register(destroy)


class ShardedDataModule(pl.LightningDataModule):
    """Base: a resumable training loader over ``make_dataset(rank, world_size)``.

    Args:
        loader_workers: DataLoader worker processes per rank.
        persistent_workers: keep them (and their data-server connections) across epochs.
        multiprocessing_context: how workers start ("forkserver" is safe after gRPC calls).
    """

    def __init__(self, loader_workers: int = 2, persistent_workers: bool = True,
                 multiprocessing_context: str = "forkserver") -> None:
        super().__init__()
        if not isinstance(loader_workers, int) or loader_workers < 0:
            raise ConfigError(f"loader_workers={loader_workers!r} must be an int >= 0")
        self.loader_workers = loader_workers
        self.persistent_workers = persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self.loader: ResumableLoader | None = None
        self._audit: AuditLog | None = None
        self._pending: collections.deque = collections.deque()  # (state, record) of yielded, untrained batches
        self._taken: ResumeState | None = None  # state as of the last batch that reached the step
        self._to_load: dict[str, Any] | None = None

    def make_dataset(self, rank: int, world_size: int) -> ShardedBatches:  # pragma: no cover - abstract
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.loader is not None:
            return
        _destroy_gloo_group_at_exit()  # once per process; at exit it looks for a gloo group
        rank = self.trainer.global_rank if self.trainer is not None else 0
        world = self.trainer.world_size if self.trainer is not None else 1
        dataset = self.make_dataset(rank, world)
        if self.trainer is not None and dataset.epochs is None and (self.trainer.max_epochs or 0) > 0:
            dataset.epochs = self.trainer.max_epochs  # fetch each next epoch's first batches ahead
        workers = self.loader_workers
        self.loader = ResumableLoader(DataLoader(
            dataset, batch_size=None, num_workers=workers, persistent_workers=bool(workers and self.persistent_workers),
            multiprocessing_context=self.multiprocessing_context if workers else None))
        self._audit = take_audit(self.loader)
        if self._to_load is not None:
            self.load_state_dict(self._to_load)

    def train_dataloader(self) -> "_TrainFeed":
        if self.loader is None:
            self.setup("fit")
        return _TrainFeed(self)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is not None and trainer.training and self._pending:
            self._taken, record = self._pending.popleft()
            if record is not None:
                which, sha = record  # a record is made only with an audit log (_TrainFeed)
                cast(AuditLog, self._audit).write(which, self._taken.dp_rank or 0, sha)
        model = trainer.lightning_module if trainer is not None else None
        if model is not None and is_overridden("on_before_batch_transfer", model):
            batch = model.on_before_batch_transfer(batch, dataloader_idx)  # Lightning calls only one of the two
        return batch

    def data_state(self) -> dict[str, Any]:
        """This rank's data position as of the last batch that reached the training step."""
        if self._taken is not None:
            return self._taken.to_dict()
        if self.loader is not None:
            return self.loader.state_dict()
        return dict(self._to_load or {})

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.data_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        data = state_dict.get("data", state_dict)
        if self.loader is None:  # Lightning may restore before setup
            self._to_load = data
            return
        if isinstance(data, dict):  # one rank's state (a list is every rank's, loaded as it is)
            data = ResumeState.from_dict(data)
            if data.dp_size not in (None, self.loader.dataset.dp_size):
                # Lightning keeps rank 0's state; DDP ranks step together, so it stands for every rank's,
                # and the rest of the epoch is dealt to this job's ranks
                data = lockstep_states(data)
        self.loader.load_state_dict(data)
        self._pending.clear()
        self._taken = None
        self._to_load = None

    def teardown(self, stage: str | None = None) -> None:
        if self.loader is not None:
            self.loader.close()


class _TrainFeed:
    """What ``train_dataloader`` returns: the loader, with each batch's state queued for the step."""

    def __init__(self, module: ShardedDataModule) -> None:
        self.module = module

    def _loader(self) -> ResumableLoader:
        loader = self.module.loader
        if loader is None:  # train_dataloader() sets the module up before it makes this feed
            raise RuntimeError("ShardedDataModule.loader is None: call setup() before iterating its train_dataloader()")
        return loader

    def __len__(self) -> int:
        # The whole epoch: Lightning counts a resumed epoch's batches from where it stopped, and an
        # epoch dealt to another number of ranks from the steps taken before the deal.
        dataset = self._loader().dataset
        worlds = dataset.earlier_worlds(dataset.epoch)
        return (steps_before_deal(worlds) if worlds is not None else 0) + len(dataset.rank_share())

    def __iter__(self) -> Iterator[Any]:
        m = self.module
        loader = self._loader()
        if m._taken is not None:  # Lightning fetched ahead of the step: continue after the trained batch
            loader.load_state_dict(m._taken)
        m._pending.clear()
        if m.trainer is not None:
            loader.set_epoch(m.trainer.current_epoch)
        m._taken = loader.resume_state()
        for batch in loader:
            record = (loader.last_yielded, digest(batch)) if m._audit is not None else None
            m._pending.append((loader.resume_state(), record))
            yield batch

    # Lightning saves and restores stateful loaders itself: the same, exact state.
    def state_dict(self) -> dict[str, Any]:
        return self.module.data_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict({"data": state})


class RemoteDataModule(ShardedDataModule):
    """Training batches from data servers, sharded by Lightning's global rank.

    Args:
        servers: data server ``host:port`` addresses (None with ``registry=``). token: the job token.
            seed: the job's seed.
        loader_workers, persistent_workers, multiprocessing_context: see ``ShardedDataModule``.
        **dataset_kwargs: passed to ``RemoteDataset`` (connect_timeout, remainder, audit_path,
            registry for servers that join the job...).
    """

    def __init__(self, servers: Sequence[str] | str | None, token: str, seed: int = 0, loader_workers: int = 2,
                 persistent_workers: bool = True, multiprocessing_context: str = "forkserver",
                 **dataset_kwargs: Any) -> None:
        super().__init__(loader_workers, persistent_workers, multiprocessing_context)
        self.servers = servers
        self.token = token
        self.seed = seed
        self.dataset_kwargs = dataset_kwargs

    def make_dataset(self, rank: int, world_size: int) -> RemoteDataset:
        return RemoteDataset(self.servers, self.token, seed=self.seed, rank=rank, world_size=world_size,
                             **self.dataset_kwargs)


class LocalDataModule(ShardedDataModule):
    """The homogeneous mode: the same pipeline built in this process's loader workers.

    Args:
        spec: the pipeline. seed: the job's seed. **dataset_kwargs: passed to ``LocalDataset``.
    """

    def __init__(self, spec: PipelineSpec, seed: int = 0, loader_workers: int = 2, persistent_workers: bool = True,
                 multiprocessing_context: str = "forkserver", **dataset_kwargs: Any) -> None:
        super().__init__(loader_workers, persistent_workers, multiprocessing_context)
        self.spec = spec
        self.seed = seed
        self.dataset_kwargs = dataset_kwargs

    def make_dataset(self, rank: int, world_size: int) -> LocalDataset:
        return LocalDataset(self.spec, seed=self.seed, rank=rank, world_size=world_size, **self.dataset_kwargs)
