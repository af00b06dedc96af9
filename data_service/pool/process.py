"""The data worker process: loads the pipeline once, then builds batches into its slots.

Runs in a process forked from the pool's warm parent, or spawned (warm_start.py); ``WorkerPool`` in
worker_pool.py is the server side. It takes ``TaskMsg`` messages (messages.py) from the server's
pipe, builds the batch straight into one of its anonymous memfd slots (compressing first if the
server compresses) and answers with the batch header; pipeline errors go back with their
traceback and sample index.
"""
from __future__ import annotations

import logging
import mmap
import os
import signal
import time
import traceback
from typing import cast

from .fork_safety import hazards
from .messages import (SPARE_COMM, SPARE_ID, DoneMsg, ErrorMsg, FatalMsg, ImportedMsg, PromoteMsg, ReadyMsg, TaskMsg,
                       message_connection)
from .preload import ImportRecorder
from .warm_parent import rename
from ..protocol.generated import pb
from ..crc32c import copy_crc32c
from ..protocol import integrity

_PAGE = mmap.PAGESIZE


class _WorkerSlot:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.fd = os.memfd_create("hetero-slot", 0)
        os.ftruncate(self.fd, capacity)
        self.map = mmap.mmap(self.fd, capacity)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def worker_main(conn, spec_json: str, worker_id: int, num_slots: int,
                log_level: int, compression_name: str = "", nice: int = 0) -> None:
    """The process's body: load the pipeline, say ready, then build each task until told to stop.

    Says too what it imported while loading the pipeline and while building its first batch, and
    whether it holds anything a fork must not copy: a warm parent imports the same for the
    workers it forks next (preload.py).
    """
    imports: ImportRecorder | None  # None once the first batch was built
    imports = ImportRecorder()
    parent_pid = os.getppid()  # the server, or the warm parent that forked us (it exits with the server)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle
    if nice:
        os.nice(nice)
    conn = message_connection(conn)
    logging.basicConfig(level=log_level, format=_log_format(worker_id))
    comm = rename(SPARE_COMM) if worker_id == SPARE_ID else None  # a spare waits under its own name
    import torch

    torch.set_num_threads(1)
    loaded = _load(conn, spec_json)
    if loaded is None:
        return
    pipe, info = loaded
    conn.send(ReadyMsg(os.getpid(), info, imports.take(), hazards(own_sockets=1)))  # its pipe
    slots = _Slots(num_slots)
    while (msg := _next_task(conn, parent_pid, comm)) is not None:
        if msg.renew:
            # The server handed this slot's region to a consumer for good (a lease that
            # outlived its connection): never write into it again, build into a new one.
            slots.drop(msg.slot)
        done = _build(conn, pipe, info.plan, msg, slots, compression_name)
        try:
            if imports is not None:  # after the first batch only
                if imported := imports.take():
                    conn.send(ImportedMsg(imported, hazards(own_sockets=1)))
                imports.remove()
                imports = None
            if done is not None:
                conn.send(done)
        except OSError:
            return


def _load(conn, spec_json: str):
    """(pipeline, PipelineInfo), or None after telling the server why the pipeline cannot load."""
    from ..contract.pipeline import PipelineInfo, PipelineSpec

    try:
        pipe = PipelineSpec.from_json(spec_json).load()
        return pipe, PipelineInfo.of(pipe)
    except BaseException as exc:  # report why we cannot start, then exit
        conn.send(FatalMsg(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return None


def _log_format(worker_id: int) -> str:
    return f"%(asctime)s data-worker[{'spare' if worker_id == SPARE_ID else worker_id}] %(levelname)s %(message)s"


def _next_task(conn, parent_pid: int, comm: str | None) -> TaskMsg | None:
    """The next task from the server; None when told to stop, the server went away or died.
    A spare (``comm``: its name before it became one) takes its worker id on the way."""
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent_pid:
                return None  # orphaned: the server (or the warm parent, which leaves with it) died
            continue
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return None  # the server went away
        if isinstance(msg, PromoteMsg):
            for handler in logging.getLogger().handlers:
                handler.setFormatter(logging.Formatter(_log_format(msg.wid)))
            if comm is not None:
                rename(comm)
            continue
        return msg if isinstance(msg, TaskMsg) else None  # a StopMsg (or anything else): stop


class _Slots:
    """This worker's output regions, grown (as a fresh region) when a batch does not fit."""

    def __init__(self, num_slots: int) -> None:
        self._slots: list[_WorkerSlot | None] = [None] * num_slots
        self.scratch = bytearray(0)  # raw layout before compression

    def drop(self, k: int) -> None:
        old = self._slots[k]
        if old is not None:
            old.close()
            self._slots[k] = None

    def fit(self, k: int, size: int) -> tuple[_WorkerSlot, tuple[str, int] | None]:
        """Slot ``k`` with room for ``size`` bytes, and the new region's (path, capacity) when it
        had to be made (the server opens it), else None."""
        slot = self._slots[k]
        if slot is not None and slot.capacity >= size:
            return slot, None
        if slot is not None:
            slot.close()
        grown = max(size + size // 4, slot.capacity * 2 if slot else 0, _PAGE)
        slot = self._slots[k] = _WorkerSlot(-(-grown // _PAGE) * _PAGE)
        return slot, (f"/proc/{os.getpid()}/fd/{slot.fd}", slot.capacity)


def _build(conn, pipe, cfg, msg: TaskMsg, slots: _Slots, compression_name: str) -> DoneMsg | None:
    """Build the task's batch into its slot and return the report; None after reporting its error."""
    from ..contract import compression, tensor_layout
    from ..contract.pipeline import SampleError, build_batch, samples_reread

    t0 = time.perf_counter()
    skipped_before, reread_before = pipe.samples_skipped, samples_reread()
    try:
        batch = build_batch(pipe, cfg, msg.batch.seed, msg.batch.epoch, msg.batch.index)
        structure, metas, tensors, size = tensor_layout.plan_layout(batch)
    except IndexError as exc:
        conn.send(ErrorMsg(msg.task_id, pb.OUT_OF_RANGE, str(exc), "", -1))
        return None
    except SampleError as exc:
        tb = "".join(traceback.format_exception(exc.cause))
        conn.send(ErrorMsg(msg.task_id, pb.TRANSFORM_FAILED, str(exc), tb, exc.sample_index))
        return None
    except Exception as exc:  # bad batch structure from collate, and the like
        conn.send(ErrorMsg(msg.task_id, pb.TRANSFORM_FAILED, f"{type(exc).__name__}: {exc}",
                           traceback.format_exc(), -1))
        return None
    raw_size, compress_s, packed = size, 0.0, None
    if compression_name:
        if len(slots.scratch) < size:
            slots.scratch = bytearray(size)
        tensor_layout.write_payload(metas, tensors, slots.scratch)
        t1 = time.perf_counter()
        packed = compression.compress(compression_name, memoryview(slots.scratch)[:size])
        compress_s = time.perf_counter() - t1
        size = len(packed)
    slot, new = slots.fit(msg.slot, size)
    skipped = pipe.samples_skipped - skipped_before
    header = pb.BatchHeader(
        ref=msg.batch.ref(),
        structure=cast("pb.Structure", structure), tensors=metas,  # plan_layout gives a Structure value, as an int
        payload_bytes=size, raw_bytes=raw_size, compression=compression_name, compress_s=compress_s,
        samples_skipped=skipped)
    # The checksum a consumer checks where the batch arrives over the network (protocol/integrity.py),
    # summed as the payload is copied into the slot: its bytes are read from memory once.
    if packed is None:
        crc = tensor_layout.write_summed_payload(metas, tensors, slot.map, integrity.header_crc(header))
    else:
        crc = copy_crc32c(memoryview(slot.map)[:size], packed, integrity.header_crc(header))
    header.payload_crc32c = crc
    build_s = header.build_s = time.perf_counter() - t0 - compress_s
    return DoneMsg(msg.task_id, msg.slot, new, header.SerializeToString(), size, raw_size, build_s, compress_s,
                   skipped, samples_reread() - reread_before)
