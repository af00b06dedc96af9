"""Per-batch preprocessing cost of a pipeline on one CPU core (the planner's main input).

Builds a few batches with ``data_service.contract.pipeline.build_batch`` (the function data servers
and DataLoader workers run) in this process, confined to one core, one torch thread.
The first ``warmup`` batches (imports, caches) are timed but left out of the median. Each batch's
CPU seconds (the process's, every thread's) are taken beside its wall seconds: on a core other
processes share, the wall seconds grow with their load and the CPU seconds hardly move, so a
prediction for a shared machine takes the CPU seconds and the share of the cores the job had.
Cores of one machine also slow each other when all are busy (shared execution units, caches,
memory bandwidth; on this project's 2-vCPU VM a batch costs about a quarter more CPU with the
other vCPU busy): with ``busy_cpus`` a second process builds batches of the same pipeline on those
cores meanwhile, so the figures are a batch's cost in a layout that keeps them all busy. The
pipeline's finish stage (the trainer's per-batch work, e.g. uint8 -> normalised float32) is
timed on each built batch too, on the CPU: where the trainer runs on the CPU (no GPU, an
emulated step), it takes that time from the cores that would otherwise build batches. So is the
hand-off from a DataLoader worker to its trainer (the worker moves each tensor into shared
memory), which a homogeneous node pays per batch and a heterogeneous trainer without loader
workers does not.
"""
from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Iterator

log = logging.getLogger(__name__)

FINISH_PASSES = 4  # passes of the finish stage over the built batches; the last one is reported


@contextlib.contextmanager
def pinned(cpus: list[int]) -> Iterator[None]:
    """Run the block with this process confined to ``cpus``, then restore its affinity."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@dataclass
class ProfileResult:
    """Seconds per batch on one core."""

    pipeline: str
    options: dict
    cpu: int
    batch_size: int
    median_s: float
    min_s: float
    max_s: float
    warmup_batches: int
    times_s: list[float] = field(default_factory=list)
    finish_s: float = 0.0   # median seconds of the finish stage per batch on this core (0: none)
    handoff_s: float = 0.0  # median seconds for a loader worker to hand a batch to its trainer
    bytes_per_sample: float = 0.0  # tensor bytes per sample of the built batches: what a server sends, as encoded
    cpu_s: float = 0.0      # median CPU seconds per batch built (this process, every thread)
    finish_cpu_s: float = 0.0  # median CPU seconds of the finish stage per batch
    busy_cpus: list[int] = field(default_factory=list)  # cores a neighbour kept busy meanwhile


def _time_finish(finish, built: list) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``finish`` on each built batch, back to back as a trainer runs it, in
    its steady state: earlier passes pay for the allocator's first touch of the output buffers, a
    long run does not."""
    times: list[float] = []
    cpu: list[float] = []
    for _ in range(FINISH_PASSES if finish.fn is not None else 0):
        times, cpu = [], []
        for batch in built:
            start, start_cpu = time.perf_counter(), time.process_time()
            finish(batch)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return times, cpu


def _time_handoff(batch) -> float:
    """Seconds to move the batch's tensors into shared memory, as torch's DataLoader worker does
    to send a batch to its trainer (the trainer then maps them)."""
    from data_service.contract.tensor_layout import flatten

    start = time.perf_counter()
    for _, tensor in flatten(batch)[1]:
        tensor.share_memory_()
    return time.perf_counter() - start


def batch_bytes(batch) -> int:
    """Bytes of a batch's tensors: the payload a data server sends for it (before any compression)."""
    from data_service.contract.tensor_layout import flatten

    return sum(t.numel() * t.element_size() for _, t in flatten(batch)[1])


def _keep_building(target: str, options: dict, cpus: list[int], ready, stop) -> None:
    """A neighbour's load: build batches of the pipeline on ``cpus`` until ``stop`` is set."""
    import torch

    from data_service.contract.pipeline import PipelineSpec, build_batch

    os.sched_setaffinity(0, set(cpus))
    torch.set_num_threads(1)
    pipe = PipelineSpec(target, options).load()
    plan = pipe.epoch_shape()
    count = max(1, plan.num_samples // plan.batch_size)
    ready.set()
    i = 0
    while not stop.is_set():
        build_batch(pipe, plan, 1, 0, i % count)
        i += 1


@contextlib.contextmanager
def neighbour(target: str, options: dict, cpus: list[int] | None, start_timeout_s: float = 120.0) -> Iterator[None]:
    """Run the block while another process keeps ``cpus`` busy building batches (nothing when None)."""
    if not cpus:
        yield
        return
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_keep_building, args=(target, options, cpus, ready, stop), daemon=True,
                       name="profile-neighbour")
    proc.start()
    try:
        if not ready.wait(start_timeout_s):
            raise ValueError(f"the profile's neighbour on CPUs {cpus} did not load the pipeline within "
                             f"{start_timeout_s:.0f}s; profile without busy_cpus")
        yield
    finally:
        stop.set()
        proc.join(30.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)


def profile_pipeline(target: str, options: dict | None = None, batches: int = 8, cpu: int | None = None,
                     warmup: int = 1, busy_cpus: list[int] | None = None) -> ProfileResult:
    """Time ``batches`` batches of the pipeline ``target`` built on one core.

    Args:
        target: builder import path, e.g. ``examples.mnist:build_pipeline``.
        options: the builder's keyword options.
        batches: batches timed after the warm-up ones.
        cpu: core to run on (default: the first this process may use).
        warmup: batches built first and left out of the figures.
        busy_cpus: cores another process keeps busy building batches meanwhile (None: left idle).

    Returns:
        Median, min and max seconds per batch, and every timing.

    Raises:
        ValueError: ``batches`` < 1 or a pipeline with fewer batches than needed.
        data_service.ConfigError: the pipeline cannot be loaded.
    """
    import torch

    from data_service.contract.pipeline import PipelineSpec, build_batch
    from dnn_worker.device.feeder import FinishStage

    if batches < 1 or warmup < 0:
        raise ValueError(f"batches={batches} must be >= 1 and warmup={warmup} >= 0")
    cpu = sorted(os.sched_getaffinity(0))[0] if cpu is None else cpu
    pipe = PipelineSpec(target, dict(options or {})).load()
    plan = pipe.epoch_shape()
    available = plan.num_samples // plan.batch_size
    if available < batches + warmup:
        raise ValueError(f"the pipeline has {available} batches per epoch; profiling needs {batches + warmup}")
    finish = FinishStage.load(pipe.finish_target(), pipe.finish_dtypes)
    times, cpu_times, built = [], [], []
    threads = torch.get_num_threads()
    # one core, one torch thread, as a data worker builds (more threads would only take turns on
    # the core, and their spinning counts as CPU) and as the trainer's finish stage runs
    torch.set_num_threads(1)
    try:
        with pinned([cpu]), neighbour(target, dict(options or {}), busy_cpus):
            for i in range(warmup + batches):
                start, start_cpu = time.perf_counter(), time.process_time()
                built.append(build_batch(pipe, plan, 0, 0, i))
                times.append(time.perf_counter() - start)
                cpu_times.append(time.process_time() - start_cpu)
            finish_times, finish_cpu = _time_finish(finish, built)
            handoff_times = [_time_handoff(batch) for batch in built]
    finally:
        torch.set_num_threads(threads)
    if pipe.close is not None:
        pipe.close()  # what the pipeline keeps outside this process (a decoded-image cache's tmpfs folder)
    kept = times[warmup:]
    # per nominal sample: an encoded batch (a wire encoding's byte blob) need not have one row per sample
    per_sample = sum(batch_bytes(b) for b in built) / (len(built) * pipe.batch_size)
    result = ProfileResult(target, dict(options or {}), cpu, pipe.batch_size, statistics.median(kept), min(kept),
                           max(kept), warmup, times, statistics.median(finish_times) if finish_times else 0.0,
                           statistics.median(handoff_times[warmup:]), per_sample, statistics.median(cpu_times[warmup:]),
                           statistics.median(finish_cpu) if finish_cpu else 0.0, list(busy_cpus or []))
    log.info("profile %s: %.1f ms/batch median on CPU %d%s (%.1f ms of CPU; %d batches, min %.1f, max %.1f ms); "
             "finish stage %.1f ms (%.1f ms of CPU), loader hand-off %.1f ms", target, 1000 * result.median_s, cpu,
             f" beside busy CPUs {busy_cpus}" if busy_cpus else "",
             1000 * result.cpu_s, batches, 1000 * result.min_s, 1000 * result.max_s, 1000 * result.finish_s,
             1000 * result.finish_cpu_s, 1000 * result.handoff_s)
    return result
