"""Checkpoints for spot stops and resume: model, optimizer and every rank's data position.

One file, ``<checkpoint_dir>/checkpoint.pt``, written by rank 0 (temp file + fsync + rename,
so a kill mid-write leaves the previous one intact). On SageMaker the directory is
``/opt/ml/checkpoints`` (the ``CheckpointConfig.LocalPath`` default), which SageMaker syncs to
``CheckpointConfig.S3Uri`` and copies back onto every node when a spot job restarts; every
node of the job then resumes from the same file.

The data position of rank r is the trainer's outermost consumer stage's ``state_dict()`` (epoch,
seed, position = batches of r's share the training loop *trained on*, whatever was prefetched;
docs/consumer.md), so a resume yields the next unseen batch: none repeated, none skipped, with
any number of data servers. Every rank's position is kept, so a job with another number of ranks
resumes too: the batches of the epoch that no rank trained are dealt to its ranks.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

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


def check_compatible(ckpt: dict[str, Any], path: str, *, seed: int, pipeline: str, pipeline_options: dict,
                     model: str) -> None:
    """Raise ConfigError when the checkpoint was written by a job this one cannot continue.

    Another number of ranks is not a difference: the rest of the epoch is dealt to this job's
    ranks (``dnn_worker.resume.resharding``)."""
    mismatches = [f"{name}={ckpt.get(name)!r} there, {mine!r} here"
                  for name, mine in (("seed", seed), ("pipeline", pipeline),
                                     ("pipeline_options", dict(pipeline_options)), ("model_target", model))
                  if ckpt.get(name) != mine]
    if mismatches:
        raise ConfigError(f"checkpoint {path} was written by a different job ({'; '.join(mismatches)}); "
                          "resume with the same options, or start afresh with another checkpoint_dir "
                          "(or checkpoint=false)")
    states, world = ckpt.get("data"), ckpt.get("world_size")
    if not isinstance(states, list) or len(states) != world:
        got = len(states) if isinstance(states, list) else type(states).__name__
        raise ConfigError(f"checkpoint {path} holds {got} data state(s) for world_size={world!r}; it is damaged: "
                          "use another checkpoint_dir")
