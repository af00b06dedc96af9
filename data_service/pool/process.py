"""The data worker process: loads the pipeline once, then builds batches into its slots.

Runs in a spawned process (``WorkerPool`` in worker_pool.py is the server side). It takes
``TaskMsg`` messages (messages.py) from the server's pipe, builds the batch straight into one of its
anonymous memfd slots (compressing first if the server compresses) and answers with
the batch header; pipeline errors go back with their traceback and sample index.
"""
from __future__ import annotations

import logging
import mmap
import os
import signal
import time
import traceback

from .messages import DoneMsg, ErrorMsg, FatalMsg, ReadyMsg, StopMsg, TaskMsg, message_connection
from ..protocol.generated import pb

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


def worker_main(conn, spec_json: str, worker_id: int, num_slots: int, parent_pid: int,
                log_level: int, compression_name: str = "", nice: int = 0) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle
    if nice:
        os.nice(nice)
    conn = message_connection(conn)
    logging.basicConfig(level=log_level, format=f"%(asctime)s data-worker[{worker_id}] %(levelname)s %(message)s")
    import torch

    from ..contract import tensor_layout, compression
    from ..contract.pipeline import PipelineInfo, PipelineSpec, SampleError, build_batch

    torch.set_num_threads(1)
    try:
        pipe = PipelineSpec.from_json(spec_json).load()
        info = PipelineInfo.of(pipe)
    except BaseException as exc:  # report why we cannot start, then exit
        conn.send(FatalMsg(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    cfg = info.plan
    conn.send(ReadyMsg(os.getpid(), info))
    slots: list[_WorkerSlot | None] = [None] * num_slots
    scratch = bytearray(0)  # raw layout before compression
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent_pid:
                return  # orphaned: the server died
            continue
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the server went away
        if isinstance(msg, StopMsg) or not isinstance(msg, TaskMsg):
            return
        task_id, seed, epoch, index, slot_no = msg.task_id, msg.seed, msg.epoch, msg.index, msg.slot
        if msg.renew and slots[slot_no] is not None:
            # The server handed this slot's region to a consumer for good (a lease that
            # outlived its connection): never write into it again, build into a new one.
            slots[slot_no].close()
            slots[slot_no] = None
        t0 = time.perf_counter()
        skipped_before = pipe.samples_skipped
        try:
            batch = build_batch(pipe, cfg, seed, epoch, index)
            structure, metas, tensors, size = tensor_layout.plan_layout(batch)
        except IndexError as exc:
            conn.send(ErrorMsg(task_id, pb.OUT_OF_RANGE, str(exc), "", -1))
            continue
        except SampleError as exc:
            tb = "".join(traceback.format_exception(exc.cause))
            conn.send(ErrorMsg(task_id, pb.TRANSFORM_FAILED, str(exc), tb, exc.sample_index))
            continue
        except Exception as exc:  # bad batch structure from collate, and the like
            conn.send(ErrorMsg(task_id, pb.TRANSFORM_FAILED, f"{type(exc).__name__}: {exc}",
                                traceback.format_exc(), -1))
            continue
        raw_size, compress_s, packed = size, 0.0, None
        if compression_name:
            if len(scratch) < size:
                scratch = bytearray(size)
            tensor_layout.write_payload(metas, tensors, scratch)
            t1 = time.perf_counter()
            packed = compression.compress(compression_name, memoryview(scratch)[:size])
            compress_s = time.perf_counter() - t1
            size = len(packed)
        slot, new = slots[slot_no], None
        if slot is None or slot.capacity < size:
            if slot is not None:
                slot.close()
            grown = max(size + size // 4, slot.capacity * 2 if slot else 0, _PAGE)
            slot = slots[slot_no] = _WorkerSlot(-(-grown // _PAGE) * _PAGE)
            new = (f"/proc/{os.getpid()}/fd/{slot.fd}", slot.capacity)
        if packed is None:
            tensor_layout.write_payload(metas, tensors, slot.map)
        else:
            slot.map[:size] = packed
        build_s = time.perf_counter() - t0 - compress_s
        skipped = pipe.samples_skipped - skipped_before
        header = pb.BatchHeader(
            ref=pb.BatchRef(seed=seed, epoch=epoch, index=index), structure=structure, tensors=metas,
            payload_bytes=size, raw_bytes=raw_size, compression=compression_name, compress_s=compress_s,
            build_s=build_s, samples_skipped=skipped)
        try:
            conn.send(DoneMsg(task_id, slot_no, new, header.SerializeToString(), size, raw_size, build_s,
                              compress_s, skipped))
        except OSError:
            return
