"""A LightningDataModule over ``RemoteDataset`` (optional: needs ``pip install lightning``).

For training code already written for PyTorch Lightning (multi-node Lightning jobs on SageMaker)::

    dm = RemoteDataModule(["algo-1:6000"], token=token, seed=0, loader_workers=2)
    trainer = lightning.Trainer(..., use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1)
    trainer.fit(model, datamodule=dm)

``RemoteDataset`` shards by rank itself, so Lightning must not add a DistributedSampler
(``use_distributed_sampler=False``); reloading the loader each epoch lets the module move the
dataset to Lightning's current epoch.
"""
from __future__ import annotations

from typing import Sequence

from torch.utils.data import DataLoader

try:
    import lightning.pytorch as pl
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise ImportError("launcher.lightning_adapter needs PyTorch Lightning: pip install "
                      "'hetero-data-service[lightning]'") from exc

from dnn_worker import RemoteDataset


class RemoteDataModule(pl.LightningDataModule):
    """Training batches from data servers, sharded by the trainer's global rank.

    Args:
        servers: data server ``host:port`` addresses. token: the job token.
        seed: the job's seed. loader_workers: DataLoader workers per rank.
        **dataset_kwargs: passed to ``RemoteDataset`` (connect_timeout, remainder, audit_path...).
    """

    def __init__(self, servers: Sequence[str], token: str, seed: int = 0, loader_workers: int = 2,
                 **dataset_kwargs) -> None:
        super().__init__()
        self.servers = list(servers)
        self.token = token
        self.seed = seed
        self.loader_workers = loader_workers
        self.dataset_kwargs = dataset_kwargs
        self.dataset: RemoteDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        rank = self.trainer.global_rank if self.trainer is not None else 0
        world = self.trainer.world_size if self.trainer is not None else 1
        self.dataset = RemoteDataset(self.servers, self.token, seed=self.seed, rank=rank, world_size=world,
                                     **self.dataset_kwargs)

    def train_dataloader(self) -> DataLoader:
        if self.dataset is None:
            self.setup("fit")
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        self.dataset.set_epoch(epoch)
        return DataLoader(self.dataset, batch_size=None, num_workers=self.loader_workers,
                          pin_memory=bool(self.dataset.pin_memory),
                          multiprocessing_context="forkserver" if self.loader_workers else None)
