"""Checkpoints for spot stops and resume: model, optimizer and every rank's data position.

One file, ``<checkpoint_dir>/checkpoint.pt``, written by rank 0 (temp file + fsync + rename,
so a kill mid-write leaves the previous one intact). On SageMaker the directory is
``/opt/ml/checkpoints`` (the ``CheckpointConfig.LocalPath`` default), which SageMaker syncs to
``CheckpointConfig.S3Uri`` and copies back onto every node when a spot job restarts; every
node of the job then resumes from the same file.

The data position of rank r is what ``ResumableLoader.state_dict()`` describes (epoch, seed,
position = batches of r's share the training loop *trained on*), so a resume yields the next
unseen batch: none repeated, none skipped, with any number of data servers.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import time
from typing import Any, Iterator

import torch

from data_service.codec import batch_digest
from data_service.errors import ConfigError

log = logging.getLogger(__name__)

FORMAT = 1
FILE_NAME = "checkpoint.pt"


def checkpoint_path(directory: str) -> str:
    return os.path.join(directory, FILE_NAME)


def load(directory: str) -> dict[str, Any] | None:
    """The checkpoint in ``directory``, or None when there is none.

    Raises:
        ConfigError: the file exists but cannot be read, naming it and the fix.
    """
    path = checkpoint_path(directory)
    if not os.path.isfile(path):
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ConfigError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}); delete it to start "
                          "afresh, or point checkpoint_dir elsewhere") from exc
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ConfigError(f"checkpoint {path} is not a launcher checkpoint of format {FORMAT} "
                          f"(found format={ckpt.get('format') if isinstance(ckpt, dict) else type(ckpt).__name__}); "
                          "use another checkpoint_dir")
    return ckpt


def save(directory: str, ckpt: dict[str, Any]) -> str:
    """Write atomically; returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = checkpoint_path(directory)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, "time": time.time(), **ckpt}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def check_compatible(ckpt: dict[str, Any], path: str, *, world_size: int, seed: int, pipeline: str,
                     pipeline_options: dict, model: str) -> None:
    """Raise ConfigError when the checkpoint was written by a job this one cannot continue."""
    mismatches = []
    for name, mine in (("world_size", world_size), ("seed", seed), ("pipeline", pipeline),
                       ("pipeline_options", dict(pipeline_options)), ("model_target", model)):
        theirs = ckpt.get(name)
        if theirs != mine:
            mismatches.append(f"{name}={theirs!r} there, {mine!r} here")
    if mismatches:
        raise ConfigError(f"checkpoint {path} was written by a different job ({'; '.join(mismatches)}); "
                          "resume with the same options and number of DNN ranks (procs_per_node x DNN hosts), "
                          "or start afresh with another checkpoint_dir (or checkpoint=false)")


class Progress:
    """What the training loop has *trained on* of this rank's share, behind any prefetching.

    ``DeviceFeeder`` pulls batches ahead of the step, so the ``ResumableLoader``'s own count runs
    ahead of training; this counts the batches the loop took. It also writes the audit: one JSON
    line per batch the loop took (epoch, batch, rank, sha256 of the host batch).

        it = progress.feed()                 # iterable for DeviceFeeder
        for batch in DeviceFeeder(it, ...):
            progress.took()                  # before the step
    """

    def __init__(self, loader, rank: int, audit_path: str = "") -> None:
        self.loader = loader
        self.rank = rank
        self.audit_path = audit_path
        self.base: dict[str, Any] = loader.state_dict()
        self.indices: list[int] = []
        self.trained = 0
        self._digests: collections.deque = collections.deque()

    def feed(self) -> Iterator[Any]:
        """This epoch's batches from the loader (call after ``loader.set_epoch``)."""
        self.base = self.loader.state_dict()
        self.indices = self.loader.dataset.rank_indices()
        self.trained = 0
        self._digests.clear()
        return self._gen()

    def _gen(self) -> Iterator[Any]:
        for batch in self.loader:
            if self.audit_path:
                self._digests.append(batch_digest(batch))
            yield batch

    def took(self) -> None:
        """The loop took the next batch (it trains on it now)."""
        if self.audit_path:
            line = {"epoch": self.base["epoch"], "batch": self.indices[self.trained], "rank": self.base["dp_rank"],
                    "sha256": self._digests.popleft()}
            fd = os.open(self.audit_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())  # one O_APPEND write: atomic across ranks
            finally:
                os.close(fd)
        self.trained += 1

    def epoch_done(self) -> None:
        """The loader ran out: the epoch is complete (the loader moved to the next one)."""
        self.base = self.loader.state_dict()
        self.indices = []
        self.trained = 0

    def state(self) -> dict[str, Any]:
        """Where this rank resumes (``ResumableLoader.load_state_dict`` format)."""
        state = dict(self.base)
        if self.indices and self.trained >= len(self.indices):  # the epoch is complete
            state.update(epoch=self.base["epoch"] + 1, position=0)
        else:
            state["position"] = self.base["position"] + self.trained
        return state
