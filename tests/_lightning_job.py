"""A real ``lightning.Trainer`` fit over ``RemoteDataModule`` that can stop mid-epoch.

    python tests/_lightning_job.py SERVER AUDIT CKPT_DIR STOP_AT_STEP   # 0: run to the end

As one process, or as one node of a multi-node DDP job (gloo) when MASTER_ADDR, MASTER_PORT,
NODE_RANK, LOCAL_RANK and WORLD_SIZE are set, as a cluster launcher sets them. At global step
STOP_AT_STEP it writes Lightning's checkpoint, trains two more steps (lost work, as in a crash
after the last checkpoint), then stops. A run with CKPT_DIR/stop.ckpt resumes from it.
"""
from __future__ import annotations

import os
import sys

import lightning as L
import torch

from dnn_worker.lightning import RemoteDataModule

TOKEN = "test-token"
EPOCHS = 2


class TinyModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(36, 10)

    def training_step(self, batch, batch_idx):
        x = batch["image"].float().flatten(1) / 255.0
        return torch.nn.functional.cross_entropy(self.net(x), batch["label"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StopAt(L.Callback):
    """Checkpoint at ``step``, then train two more steps and stop (they are lost on resume)."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
        if self.step and trainer.global_step == self.step + 2:
            trainer.should_stop = True


class Unsized:
    """The module's loader without ``len``: Lightning then fetches one batch ahead of the step."""

    def __init__(self, feed) -> None:
        self.feed = feed

    def __iter__(self):
        return iter(self.feed)

    def state_dict(self):
        return self.feed.state_dict()

    def load_state_dict(self, state):
        self.feed.load_state_dict(state)


class UnsizedRemoteDataModule(RemoteDataModule):
    def train_dataloader(self):
        return Unsized(super().train_dataloader())


def fit(server: str, audit: str, ckpt_dir: str, stop_at: int, num_nodes: int = 1, loader_workers: int = 0,
        sized: bool = True, strategy=None) -> int:
    """Returns the global step reached."""
    path = os.path.join(ckpt_dir, "stop.ckpt")
    dm = (RemoteDataModule if sized else UnsizedRemoteDataModule)([server], TOKEN, seed=2, loader_workers=loader_workers, audit_path=audit)
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, num_nodes=num_nodes,
                        strategy=strategy or ("ddp" if num_nodes > 1 else "auto"), logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, callbacks=[StopAt(stop_at, path)])
    trainer.fit(TinyModel(), datamodule=dm, ckpt_path=path if os.path.exists(path) and not stop_at else None)
    return trainer.global_step


if __name__ == "__main__":
    server, audit, ckpt_dir, stop_at = sys.argv[1:5]
    fit(server, audit, ckpt_dir, int(stop_at), num_nodes=int(os.environ.get("WORLD_SIZE", "1")))
