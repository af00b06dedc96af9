"""The collective backend that DDP training uses: ``auto``, ``nccl``, ``gloo`` or ``smddp``.

    backend = resolve_backend("nccl")     # ConfigError at start if this machine cannot run it
    torch.distributed.init_process_group(backend, ...)

* ``auto`` (the default): ``nccl`` where CUDA is available, else ``gloo``.
* ``nccl``: NVIDIA's collectives; needs CUDA GPUs and a PyTorch build with NCCL.
* ``gloo``: PyTorch's CPU collectives (also works on CUDA tensors, slower than NCCL).
* ``smddp``: SageMaker's distributed data parallel library (AllReduce tuned for ml.p4d/ml.p5
  networks). Its module ``smdistributed.dataparallel.torch.torch_smddp`` registers the backend
  when imported; it is imported only when chosen, and only SageMaker's PyTorch training images
  ship it.

``lightning_strategy`` gives the Lightning strategy that matches a backend, for training code
that uses ``dnn_worker.lightning``'s DataModules.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.distributed as dist

from data_service.errors import ConfigError

BACKENDS = ("auto", "nccl", "gloo", "smddp")
SMDDP_MODULE = "smdistributed.dataparallel.torch.torch_smddp"


def check_choice(choice: str) -> str:
    """``choice`` if it names a backend, else ConfigError listing the known ones."""
    if choice not in BACKENDS:
        raise ConfigError(f"ddp_backend={choice!r} must be one of {', '.join(BACKENDS)} "
                          "(auto: nccl with CUDA, else gloo)")
    return choice


def load_smddp() -> None:
    """Import SageMaker's data parallel library, which registers the ``smddp`` backend."""
    try:
        importlib.import_module(SMDDP_MODULE)
    except ImportError as exc:
        raise ConfigError(f"ddp_backend='smddp' needs SageMaker's distributed data parallel library ({SMDDP_MODULE}: "
                          f"{exc}); it is installed only in SageMaker's PyTorch training images (GPU instances "
                          "such as ml.p4d.24xlarge); use ddp_backend=nccl or auto elsewhere") from exc


def resolve_backend(choice: str = "auto", cuda: bool | None = None) -> str:
    """The backend name for ``torch.distributed.init_process_group``.

    Args:
        choice: one of ``BACKENDS``.
        cuda: whether this process trains on CUDA (default: ``torch.cuda.is_available()``).

    Raises:
        ConfigError: an unknown choice, or one this machine cannot run (nccl or smddp without
            CUDA, a PyTorch build without the backend, smddp's library absent), naming the fix.
    """
    check_choice(choice)
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if choice == "auto":
        return "nccl" if cuda else "gloo"
    if choice == "smddp":
        load_smddp()
    if choice in ("nccl", "smddp") and not cuda:
        raise ConfigError(f"ddp_backend={choice!r} needs CUDA GPUs, and this process has none "
                          f"(torch {torch.__version__}, CUDA available: no); use ddp_backend=gloo or auto on CPU")
    available = {"nccl": dist.is_nccl_available, "gloo": dist.is_gloo_available}.get(choice)
    if available is not None and not available():
        raise ConfigError(f"ddp_backend={choice!r}: this PyTorch build ({torch.__version__}) has no {choice} "
                          "backend; use ddp_backend=auto")
    return choice


def lightning_strategy(choice: str = "auto", **kwargs: Any) -> Any:
    """Lightning's ``DDPStrategy`` over the backend ``choice`` resolves to (needs ``lightning``).

    nccl, gloo and smddp all run under ``DDPStrategy(process_group_backend=...)``; ``kwargs``
    go to ``DDPStrategy`` (e.g. ``find_unused_parameters``)::

        trainer = lightning.Trainer(strategy=lightning_strategy("smddp"), accelerator="gpu", devices=8, num_nodes=2)
    """
    backend = resolve_backend(choice)
    try:
        from lightning.pytorch.strategies import DDPStrategy
    except ImportError as exc:
        raise ConfigError("lightning_strategy needs PyTorch Lightning: pip install "
                          "'hetero-data-service[lightning]'") from exc
    return DDPStrategy(process_group_backend=backend, **kwargs)
