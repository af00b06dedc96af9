"""A block-shuffled pipeline that logs, to a file, each block prefetch, each sample read, and which
process built its data set and transform (``<what> <pid>`` lines)."""
from __future__ import annotations

import os

import torch

from data_service import Pipeline
from data_service.contract.pipeline import ServerSide


def _write(log: str, line: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Recording:
    def __init__(self, n: int, block: int, log: str) -> None:
        self.n, self.block, self.log = n, block, log
        _write(log, f"dataset {os.getpid()}")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        _write(self.log, f"get {i // self.block}")
        return torch.tensor([i])


class Identity:
    def __init__(self, log: str) -> None:
        _write(log, f"transform {os.getpid()}")

    def __call__(self, sample):
        return sample


class Prefetcher:
    """The data node's block prefetcher: logs each block it is asked to fetch."""

    def __init__(self, log: str, block: int) -> None:
        self.log, self.block_samples = log, block

    def prefetch_block(self, block: int) -> None:
        _write(self.log, f"prefetch {block}")


def build(log: str, n: int = 128, batch_size: int = 4, block: int = 8, interleave: int = 2) -> Pipeline:
    return Pipeline(dataset=Recording(n, block, log), batch_size=batch_size, transform=Identity(log),
                    shuffle_block=block, interleave=interleave)


def server_side(log: str, n: int = 128, batch_size: int = 4, block: int = 8, interleave: int = 2) -> ServerSide:
    return ServerSide(prefetcher=Prefetcher(log, block))


build.server_side = server_side


def uneven(marker: str) -> Pipeline:
    """A builder that depends on more than its options: the first process to build it gets 10 samples, others 11."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        n = 10
    except FileExistsError:
        n = 11
    return Pipeline(dataset=list(range(n)), batch_size=2)


uneven.server_side = lambda marker: ServerSide()


def build_plain(log: str, n: int = 128, batch_size: int = 4) -> Pipeline:
    """The same samples without a ``server_side``, with a ``close`` hook a data server does not call."""
    return Pipeline(dataset=Recording(n, n, log), batch_size=batch_size, transform=Identity(log),
                    close=lambda: _write(log, f"close {os.getpid()}"))
