"""The training loop of one rank: data from data servers (or in-process), DDP, metrics.

``train(local_rank, job)`` is what the DNN node runs once per local GPU (or once on CPU).
What it trains is pluggable by import path (``model``, ``step``, ``evaluate``,
``optimizer`` options); ``emulate_step_s`` replaces the step by a sleep of that length, an
*emulated accelerator step* for measuring the data path on machines without a GPU; metrics
then say ``"step_kind": "emulated"``.

Batches come through the public consumer API exactly as a user's loop would use it:
``DeviceFeeder(ResumableLoader(DataLoader(dataset)))`` (pinned, prefetched copies to the
device, then the pipeline's ``finish`` stage, e.g. uint8 -> normalised float32), in every mode.
The checkpoint holds ``feeder.state_dict()``, exact as of the last batch trained on whatever the
prefetch depth; the audit log is the dataset's ``audit_path``, written by the outermost stage.

Stopping (SIGTERM: spot interruption, StopTrainingJob): the current step finishes, all ranks
agree to stop at the same step, rank 0 writes a checkpoint (model, optimizer, every rank's
data position) to ``checkpoint_dir``, and the run ends with status ``stopped``. A run that
finds a checkpoint there resumes from it: no batch repeated or skipped.
"""
from __future__ import annotations

import datetime
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from data_service.errors import ConfigError, install_extra
from data_service.contract.pipeline import PipelineSpec

from .. import log_setup as logs
from ..autoscale import advice_and_autoscaler
from ..config import OPTIMIZERS, LaunchConfig, load_object
from ..job.output_files import write_json
from ..metric_lines import DataNodeFigures, summary_line
from . import checkpoint
from .step_stats import StepStats, StepTimer, job_metrics
from .train_loop import STOP, Run, gathered, loader_and_feeder, log_outcome, run_epochs, save_checkpoint

if TYPE_CHECKING:  # the consumer is imported where a trainer starts, not with the launcher
    from dnn_worker.resume.state import ResumeState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainJob:
    """Everything a trainer process needs (picklable: it crosses a spawn)."""

    cfg: LaunchConfig
    mode: str                       # "heterogeneous" | "homogeneous"
    host: str
    dnn_hosts: tuple[str, ...]
    node_rank: int
    nprocs: int
    master_addr: str
    model_dir: str
    output_dir: str
    token: str = ""
    servers: tuple[str, ...] = ()   # data server addresses (heterogeneous)
    server_hosts: tuple[str, ...] = ()
    checkpoint_dir: str = ""        # "" with checkpoint=true: no checkpoints (tests calling train())
    shared_group: bool = False      # a DNN-only job: its data servers are its registry's (NodeAssignment)
    extra: dict = field(default_factory=dict, hash=False)

    @property
    def world_size(self) -> int:
        return self.nprocs * len(self.dnn_hosts)


EXIT_STOPPED = 143  # 128 + SIGTERM: what a process ended by SIGTERM reports; see docs/launcher.md


def request_stop() -> None:
    """Ask the training loop of this process to stop after the current step (as SIGTERM does)."""
    STOP.set()


def pipeline_fingerprint(cfg: LaunchConfig) -> str:
    """The job's pipeline fingerprint: the data servers a registry lists must run this one."""
    return PipelineSpec(cfg.data.pipeline, cfg.data.pipeline_options).fingerprint()


def make_dataset(job: TrainJob, rank: int):
    cfg = job.cfg
    # The outermost consumer stage (DeviceFeeder) writes the audit: batches the loop trained on.
    # Knowing the epochs lets the dataset fetch the next epoch's first batches before this one ends.
    common: dict[str, Any] = dict(seed=cfg.train.seed, rank=rank, world_size=job.world_size,
                                  audit_path=cfg.train.audit_path or None, epochs=cfg.train.epochs)
    if job.servers or job.shared_group:  # heterogeneous, or a homogeneous node's own data server
        from dnn_worker import RemoteDataset
        # pinned receive buffers only help without loader workers (a worker's tensors are copied
        # into shared memory; the DataLoader pins those in the trainer instead)
        # with a registry, servers that join the job are used too (the job's pipeline only)
        elastic: dict[str, Any] = (dict(registry=cfg.elastic.registry, fingerprint=pipeline_fingerprint(cfg))
                                   if cfg.elastic.registry and job.mode == "heterogeneous" else {})
        return RemoteDataset(list(job.servers), job.token, connect_timeout=cfg.dnn.connect_timeout_s,
                             pin_memory=torch.cuda.is_available() and cfg.data.workers_for(job.mode) == 0, **elastic,
                             **common)
    from dnn_worker import LocalDataset
    return LocalDataset(PipelineSpec(cfg.data.pipeline, cfg.data.pipeline_options), **common)


def make_optimizer(cfg: LaunchConfig, params) -> torch.optim.Optimizer:
    cls = load_object(cfg.model.optimizer_path(), "optimizer")
    try:
        return cls(params, lr=cfg.model.lr)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"optimizer={cfg.model.optimizer!r} with lr={cfg.model.lr}: {exc}; use one of "
                          f"{sorted(OPTIMIZERS)} or an import path such as torch.optim:AdamW") from exc


def _tensorboard(job: TrainJob):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ConfigError(f"tensorboard=true needs the tensorboard package ({exc}); "
                          f"{install_extra('tensorboard')}") from exc
    return SummaryWriter(os.path.join(job.output_dir, "tensorboard"))


def _data_node_stats(job: TrainJob) -> list[dict]:
    from dnn_worker import ControlClient

    out = []
    for host, address in zip(job.server_hosts, job.servers):
        try:
            with ControlClient(address, job.token, "trainer-metrics") as ctl:
                s = ctl.stats(timeout=5.0)
            node = DataNodeFigures(host, address=address, batches_sent=s.batches_sent, bytes_sent=s.bytes_sent,
                                   workers=s.workers, worker_busy_fraction=s.worker_busy_fraction,
                                   batch_errors=s.batch_errors, samples_skipped=s.samples_skipped)
        except Exception as exc:  # stats are informative; training already succeeded
            node = DataNodeFigures(host, address=address, error=f"{type(exc).__name__}: {exc}")
        out.append(node.to_json())
    return out


def train(local_rank: int, job: TrainJob, results=None) -> dict[str, Any]:
    """Train on this rank; rank 0 writes the model, metrics.json and checkpoints. Returns this
    rank's summary (``status``: ``completed`` or ``stopped``), also put on ``results`` (a queue)
    as ``(local_rank, status)`` when given."""
    cfg = job.cfg
    rank = job.node_rank * job.nprocs + local_rank
    logs.setup("trainer", job.host, rank, cfg.job.log_level)
    if results is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: STOP.set())  # a spawned rank: the DNN node forwards it
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        # intra-op threads share the node's CPUs with the other ranks and the loader workers
        builders = cfg.data.workers_for(job.mode)
        if job.mode == "homogeneous":
            builders += cfg.data.homogeneous_server_workers(job.nprocs)
        free = len(os.sched_getaffinity(0)) - builders
        torch.set_num_threads(max(1, free // job.nprocs))
    if job.world_size > 1 or cfg.dnn.ddp_backend != "auto":  # a chosen backend runs even on one rank
        from dnn_worker.device.ddp import resolve_backend

        backend = resolve_backend(cfg.dnn.ddp_backend, cuda)
        dist.init_process_group(backend, init_method=f"tcp://{job.master_addr}:{cfg.dnn.master_port}",
                                rank=rank, world_size=job.world_size,
                                timeout=datetime.timedelta(seconds=cfg.dnn.dist_timeout_s))
        log.info("DDP process group: backend %s, %d rank(s)", backend, job.world_size)
    try:
        summary = _train(job, rank, local_rank, device)
        if results is not None:
            results.put((local_rank, summary["status"]))
        return summary
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(job: TrainJob, rank: int, local_rank: int, device: torch.device) -> dict[str, Any]:
    cfg = job.cfg
    started = time.time()
    torch.manual_seed(cfg.train.seed)
    dataset = make_dataset(job, rank)
    finish = dataset.finish_stage()
    loader, feeder = loader_and_feeder(job, dataset, finish, device)
    plain = load_object(cfg.model.model, "model")(**cfg.model.model_options).to(device)
    optimizer = make_optimizer(cfg, plain.parameters())
    resumed = _resume(job, rank, plain, optimizer, feeder, dataset.num_batches_per_epoch())
    run = _run(job, rank, local_rank, device, plain, optimizer, feeder, resumed)
    log.info("%s training: %d rank(s) on %d host(s), %s step, pipeline %s, finish stage %s on %s",
             job.mode, job.world_size, len(job.dnn_hosts),
             f"emulated {cfg.emulate.emulate_step_s}s" if run.step_fn is None else cfg.model.step, cfg.data.pipeline,
             finish.target or "none", device)
    try:
        run_epochs(run)
    finally:
        # On every path, errors included: a failing run's traceback would otherwise keep the
        # loader alive, and its workers (which ignore SIGTERM) would hold the exit forever.
        loader.close()
    status = "stopped" if run.stopped else "completed"
    log_outcome(run, resumed)
    ckpt_path = save_checkpoint(job, rank, plain, optimizer, feeder, run.steps_done(), status)
    summary = dict(run.stats.summary(), rank=rank, host=job.host, status=status)
    summaries = gathered(job, summary)
    if rank == 0:
        _finish(job, plain, device, summaries, run.loss, started, run.step_fn is None, status, resumed, ckpt_path,
                finish.wire.name if finish.wire is not None else "uint8")
    if run.writer is not None:
        run.writer.close()
    if job.world_size > 1:
        dist.barrier()
    return summary


def _run(job: TrainJob, rank: int, local_rank: int, device: torch.device, plain, optimizer, feeder,
         resumed: Resumed | None) -> Run:
    """The loop's state before its first step: the model the step trains, the step, the metrics."""
    cfg = job.cfg
    model = plain
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(
            plain, device_ids=[local_rank] if device.type == "cuda" else None)
    step_fn = None if cfg.emulate.emulate_step_s > 0 else load_object(cfg.model.step, "step")
    writer = _tensorboard(job) if cfg.train.tensorboard and rank == 0 else None
    advisor, autoscaler = advice_and_autoscaler(job, rank)
    stats = StepStats(cfg.train.warmup_steps, cfg.train.log_every, advisor=advisor, autoscaler=autoscaler)
    return Run(job, rank, device, plain, model, optimizer, feeder, step_fn, writer, stats, StepTimer(stats),
               done_before=resumed.steps if resumed else 0)


@dataclass(frozen=True)
class Resumed:
    """What a run resumed: the steps its checkpoint had trained and this rank's data position."""

    steps: int
    position: ResumeState


def _resume(job: TrainJob, rank: int, model, optimizer, data, epoch_batches: int) -> Resumed | None:
    """Load model, optimizer and this rank's data position from the checkpoint, when there is one
    (from every rank's, dealt again, when the checkpoint has another number of ranks). ``data`` is
    the outermost consumer stage; the checkpoint's dicts are parsed by its ``load_state_dict``."""
    cfg = job.cfg
    if not cfg.checkpoints.checkpoint or not job.checkpoint_dir:
        return None
    ckpt = checkpoint.load(job.checkpoint_dir)
    path = checkpoint.checkpoint_path(job.checkpoint_dir)
    if ckpt is None:
        log.info("no checkpoint in %s: starting afresh", job.checkpoint_dir)
        return None
    checkpoint.check_compatible(ckpt, path, seed=cfg.train.seed, pipeline=cfg.data.pipeline,
                                pipeline_options=cfg.data.pipeline_options, model=cfg.model.model)
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ConfigError(f"checkpoint {path} does not fit model={cfg.model.model!r} / optimizer={cfg.model.optimizer!r} "
                          f"({exc}); resume with the same model and optimizer, or use another checkpoint_dir") from exc
    if ckpt["world_size"] == job.world_size:
        data.load_state_dict(ckpt["data"][rank])
    else:
        data.load_state_dict(ckpt["data"])  # every old rank's position: the rest of the epoch, dealt again
        _log_dealt(ckpt["world_size"], job.world_size, data.resume_state(), len(data), epoch_batches)
    position: ResumeState = data.resume_state()
    log.info("resuming from %s (%s, written by %s): %d steps done; epoch %d from batch %d of this rank's %s",
             path, ckpt.get("status"), ckpt.get("host"), ckpt["steps"], position.epoch, position.position,
             "part of the rest" if position.dealt else "share")
    return Resumed(int(ckpt["steps"]), position)


def _log_dealt(old: int, new: int, state: ResumeState, mine: int, epoch_batches: int) -> None:
    from dnn_worker.resume.resharding import remaining

    left = len(remaining(epoch_batches, state.earlier_worlds)) if state.dealt else 0
    log.info("the checkpoint was written by %d rank(s), this job has %d: epoch %d goes on with the %d of its %d "
             "batches no rank trained, %d to each rank (%d left out, as the last of every epoch: equal counts per "
             "rank); later epochs are shared among %d rank(s)",
             old, new, state.epoch, left, epoch_batches, mine, max(0, left - mine * new), new)


def _finish(job: TrainJob, plain, device, summaries, loss, started: float, emulated: bool, status: str,
            resumed: Resumed | None, ckpt_path: str | None, wire: str = "uint8") -> None:
    cfg = job.cfg
    stopped = status == "stopped"
    evaluate = cfg.model.evaluate_path()
    # a stop has ~120 s: no evaluation
    accuracy = load_object(evaluate, "evaluate")(plain, device) if evaluate and not emulated and not stopped else None
    os.makedirs(job.model_dir, exist_ok=True)
    torch.save(plain.state_dict(), os.path.join(job.model_dir, "model.pt"))  # also when stopped: an artifact
    data_nodes = _data_node_stats(job) if job.mode == "heterogeneous" and not stopped else []
    metrics = job_metrics(summaries, {
        "mode": job.mode, "step_kind": "emulated" if emulated else "real",
        "emulate_step_s": cfg.emulate.emulate_step_s if emulated else None, "test_accuracy": accuracy,
        "final_loss": loss, "world_size": job.world_size,
        "ddp_backend": dist.get_backend() if dist.is_initialized() else None, "epochs": cfg.train.epochs, "seed": cfg.train.seed,
        "warmup_steps": cfg.train.warmup_steps,
        "pipeline": cfg.data.pipeline, "pipeline_options": cfg.data.pipeline_options, "wire_encoding": wire, "model": cfg.model.model,
        "dnn_hosts": list(job.dnn_hosts), "data_servers": list(job.servers),
        "wall_time_s": time.time() - started, "nodes": data_nodes, "status": status,
        "resumed_from_steps": resumed.steps if resumed else None, "checkpoint": ckpt_path, **job.extra})
    write_json(os.path.join(job.output_dir, "metrics.json"), metrics)
    log.info("%s", summary_line(metrics, job.output_dir))  # read by the job's MetricDefinitions
