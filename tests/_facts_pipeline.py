"""A pipeline whose every sample says what the data worker that built it holds: grpc loaded or
not, its threads, its sockets, its pid. Its builder imports ``_marked_at_build`` and its dataset
``_marked_at_first_batch`` (each records which processes imported it, see ``_import_marks``);
``thread=True`` makes the builder import a module that starts a thread."""
from __future__ import annotations

import os
import sys

import torch

from data_service import Pipeline
from data_service.pool.fork_safety import sockets, threads


class _Facts:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        import _marked_at_first_batch  # noqa: F401  (imported while the worker builds its first batch)

        return {"grpc": torch.tensor(int("grpc" in sys.modules)), "threads": torch.tensor(len(threads())),
                "sockets": torch.tensor(sockets()), "pid": torch.tensor(os.getpid())}


def build_pipeline(batch_size: int = 4, thread: bool = False) -> Pipeline:
    import _marked_at_build  # noqa: F401  (imported while the worker builds the pipeline)

    if thread:
        import _thread_at_import  # noqa: F401

    return Pipeline(dataset=_Facts(), batch_size=batch_size, shuffle=False)
