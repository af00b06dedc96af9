"""One rank's epochs: batches through the step, the stop every rank agrees on, checkpoints on the way.

:mod:`launcher.train.trainer` sets a run up (data, model, process group) and writes its results; this
module runs it: a :class:`Run` holds what the loop trains and how far it got, and
:func:`run_epochs` drives it from the feeder's epoch to the end, ``max_steps`` or a stop.
``job`` is always the rank's ``launcher.train.trainer.TrainJob`` (not imported: that module imports this one).
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from . import checkpoint
from .step_stats import StepStats, StepTimer, batch_size_of

# The trainer's logger: its lines keep the name they are known (and grepped) by.
log = logging.getLogger("launcher.train.trainer")

# Set by SIGTERM (or request_stop): finish the current step, checkpoint, stop.
STOP = threading.Event()

_END = object()  # no batch to train on: the epoch ended, or a lone rank stops


def _ignore_sigterm(worker_id: int) -> None:
    """DataLoader workers leave stopping to the trainer (a process-group SIGTERM must not kill
    them mid-epoch); they end with it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def loader_and_feeder(job, dataset, finish, device: torch.device):
    """(the ``ResumableLoader``, the ``DeviceFeeder`` on top of it) that bring ``dataset``'s batches to ``device``."""
    from dnn_worker import DeviceFeeder, ResumableLoader

    cuda = device.type == "cuda"
    # forkserver, not fork: this process has used gRPC (Hello), and a forked child of a gRPC
    # process can deadlock on its first call. Persistent workers keep their connections to the
    # data servers from one epoch to the next.
    workers = job.cfg.data.workers_for(job.mode)
    loader = ResumableLoader(DataLoader(dataset, batch_size=None, num_workers=workers,
                                        pin_memory=cuda and workers > 0, persistent_workers=workers > 0,
                                        worker_init_fn=_ignore_sigterm if workers else None,
                                        multiprocessing_context="forkserver" if workers else None))
    return loader, DeviceFeeder(loader, device, finish=finish, depth=2, pin_memory=cuda)


@dataclass
class Run:
    """What one rank's loop trains, and how far it got."""

    job: Any                        # the rank's TrainJob
    rank: int
    device: torch.device
    plain: torch.nn.Module          # the model itself: what checkpoints and the artifact hold
    model: torch.nn.Module          # what the step trains (DDP around ``plain`` when distributed)
    optimizer: Any
    feeder: Any
    step_fn: Callable | None        # None: an emulated step (a sleep)
    writer: Any                     # TensorBoard's SummaryWriter, or None
    stats: StepStats
    timer: StepTimer
    done_before: int = 0            # steps of the run this one resumed
    loss: Any = None
    stopped: bool = False

    def steps_done(self) -> int:
        """Steps trained so far, those before a resume included."""
        return self.done_before + self.stats.steps

    def at_max_steps(self) -> bool:
        """Whether ``max_steps`` (when set) is reached."""
        max_steps = self.job.cfg.train.max_steps
        return bool(max_steps and self.steps_done() >= max_steps)


def run_epochs(run: Run) -> None:
    """Train from the feeder's epoch on, until the last epoch, ``max_steps`` or an agreed stop."""
    first_epoch = True
    for epoch in range(run.feeder.epoch, run.job.cfg.train.epochs):
        if run.stopped or run.at_max_steps():
            break
        _epoch(run, epoch, first_epoch)
        first_epoch = False


def _epoch(run: Run, epoch: int, first: bool) -> None:
    run.feeder.set_epoch(epoch)
    bar = _progress_bar(run, epoch)
    batches = iter(run.feeder)
    try:
        if first:  # later epochs' set-up counts: an epoch boundary is part of the step after it
            run.timer.restart()
        while not run.at_max_steps():
            if _stop_agreed(run.job, run.device):
                run.stopped = True
                break
            batch = _next_batch(run, batches)
            if batch is _END:
                break
            _step(run, batch, bar)
    finally:
        batches.close()  # ends this epoch's iteration (non-persistent workers stop here)
    if bar is not None:
        bar.close()
    log.info("epoch %d %s: %d steps so far%s", epoch, "stopped" if run.stopped else "done", run.steps_done(),
             f", loss {run.loss:.4f}" if run.loss is not None else "")


def _progress_bar(run: Run, epoch: int):
    """Rank 0's progress bar on a terminal; None elsewhere."""
    if run.rank != 0 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=len(run.feeder), desc=f"epoch {epoch}", leave=False)


def _next_batch(run: Run, batches):
    """The next batch, or ``_END``: at the epoch's end, or when fetching fails on a lone rank that
    was told to stop (its data nodes may be stopping too), which then stops with what it trained."""
    try:
        return run.timer.fetch(batches)
    except StopIteration:
        return _END
    except Exception as exc:
        if STOP.is_set() and run.job.world_size == 1:  # e.g. the data nodes were stopped too
            log.warning("fetching a batch failed after SIGTERM (%s: %s); checkpointing what was "
                        "trained", type(exc).__name__, exc)
            run.stopped = True
            return _END
        raise


def _step(run: Run, batch, bar) -> None:
    cfg = run.job.cfg
    if run.step_fn is None:
        time.sleep(cfg.emulate.emulated_step_s(run.steps_done()))
    else:
        run.loss = run.step_fn(run.model, batch, run.optimizer, run.device)
    run.timer.done(batch_size_of(batch))
    if bar is not None:
        bar.update(1)
    if run.writer is not None and run.loss is not None:
        run.writer.add_scalar("loss", run.loss, run.steps_done())
    if cfg.checkpoints.checkpoint_every and run.steps_done() % cfg.checkpoints.checkpoint_every == 0:
        save_checkpoint(run.job, run.rank, run.plain, run.optimizer, run.feeder, run.steps_done(), "running")


def _stop_agreed(job, device: torch.device) -> bool:
    """True when any rank was asked to stop; every rank calls it at the same step, so all stop
    together (one tiny all-reduce per step when world_size > 1)."""
    local = STOP.is_set()
    if job.world_size == 1:
        return local
    flag = torch.tensor([1.0 if local else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def save_checkpoint(job, rank: int, model, optimizer, data, steps: int, status: str) -> str | None:
    """Every rank's data position to rank 0, which writes the checkpoint (a collective call)."""
    cfg = job.cfg
    if not cfg.checkpoints.checkpoint or not job.checkpoint_dir:
        return None
    mine = data.resume_state()
    states = gathered(job, mine.to_dict())  # the checkpoint holds plain dicts (torch.load, any release)
    if rank != 0:
        return None
    path = checkpoint.save(job.checkpoint_dir, {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "data": states, "steps": steps,
        "status": status, "world_size": job.world_size, "seed": cfg.train.seed, "pipeline": cfg.data.pipeline,
        "pipeline_options": dict(cfg.data.pipeline_options), "model_target": cfg.model.model, "epochs": cfg.train.epochs,
        "host": job.host, "job_name": job.extra.get("job_name", "")})
    log.info("checkpoint (%s) written to %s after %d steps; data position of rank 0: epoch %d, batch %d",
             status, path, steps, mine.epoch, mine.position)
    return path


def log_outcome(run: Run, resumed: object) -> None:
    """Warn when the run stopped early, or when the checkpoint it resumed had nothing left to train."""
    cfg = run.job.cfg
    if run.stopped:
        log.warning("SIGTERM: stopped after step %d (%d this run); data position %s", run.steps_done(),
                    run.stats.steps, run.feeder.resume_state())
    elif resumed and run.stats.steps == 0:
        log.warning("the checkpoint in %s had nothing left to train (epochs=%d, max_steps=%d); raise epochs "
                    "to train more, or use another checkpoint_dir to start afresh", run.job.checkpoint_dir,
                    cfg.train.epochs, cfg.train.max_steps)


def gathered(job, mine: Any) -> list:
    """Every rank's ``mine``, in rank order (a collective call when world_size > 1)."""
    if job.world_size <= 1:
        return [mine]
    every = [None] * job.world_size
    dist.all_gather_object(every, mine)
    return every
