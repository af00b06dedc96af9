"""Messages on the pipe between the worker pool (server side) and a data worker process.

Each message is a small typed tuple pickled by ``multiprocessing`` over the pipe to a
process the server itself spawned; nothing here ever crosses the network.
"""
from __future__ import annotations

from typing import NamedTuple, Union


class TaskMsg(NamedTuple):
    """Server -> worker: build batch ``index`` of ``epoch`` (sampler ``seed``) into slot ``slot``."""

    task_id: int
    seed: int
    epoch: int
    index: int
    slot: int
    renew: bool  # the slot's region was handed to a consumer for good: build into a new one


class StopMsg(NamedTuple):
    """Server -> worker: exit."""


class ReadyMsg(NamedTuple):
    """Worker -> server: the pipeline is loaded."""

    pid: int


class FatalMsg(NamedTuple):
    """Worker -> server: the pipeline could not be loaded; the worker exits."""

    message: str
    traceback: str


class DoneMsg(NamedTuple):
    """Worker -> server: the batch of ``task_id`` is in slot ``slot``.

    ``new_region`` is ``(path, capacity)`` when the slot lives in a region the server has not
    opened yet (first use, grown, or renewed); ``header`` is a serialized ``BatchHeader``.
    """

    task_id: int
    slot: int
    new_region: tuple[str, int] | None
    header: bytes


class ErrorMsg(NamedTuple):
    """Worker -> server: building the batch of ``task_id`` failed."""

    task_id: int
    kind: int  # pb.ErrorKind
    message: str
    traceback: str
    sample_index: int


ToWorker = Union[TaskMsg, StopMsg]
FromWorker = Union[ReadyMsg, FatalMsg, DoneMsg, ErrorMsg]
