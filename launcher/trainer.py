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
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec

from . import checkpoint, log_setup as logs
from .autoscale import advice_and_autoscaler
from .config import LaunchConfig, load_object
from .metric_lines import summary_line
from .step_stats import StepStats, StepTimer, batch_size_of, job_metrics, write_json

log = logging.getLogger(__name__)

OPTIMIZERS = {"adadelta": "torch.optim:Adadelta", "sgd": "torch.optim:SGD", "adam": "torch.optim:Adam",
              "adamw": "torch.optim:AdamW"}


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
    extra: dict = field(default_factory=dict, hash=False)

    @property
    def world_size(self) -> int:
        return self.nprocs * len(self.dnn_hosts)


# Set by SIGTERM (or request_stop): finish the current step, checkpoint, stop.
STOP = threading.Event()
EXIT_STOPPED = 143  # 128 + SIGTERM: what a process ended by SIGTERM reports; see docs/launcher.md


def request_stop() -> None:
    """Ask the training loop of this process to stop after the current step (as SIGTERM does)."""
    STOP.set()


def _on_sigterm(signum, frame) -> None:  # only sets a flag: the loop logs and acts
    STOP.set()


def _ignore_sigterm(worker_id: int) -> None:
    """DataLoader workers leave stopping to the trainer (a process-group SIGTERM must not kill
    them mid-epoch); they end with it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def make_dataset(job: TrainJob, rank: int):
    cfg = job.cfg
    # The outermost consumer stage (DeviceFeeder) writes the audit: batches the loop trained on.
    # Knowing the epochs lets the dataset fetch the next epoch's first batches before this one ends.
    common = dict(seed=cfg.seed, rank=rank, world_size=job.world_size, audit_path=cfg.audit_path or None,
                  epochs=cfg.epochs)
    if job.servers:  # heterogeneous, or a homogeneous node's own data server
        from dnn_worker import RemoteDataset
        # pinned receive buffers only help without loader workers (a worker's tensors are copied
        # into shared memory; the DataLoader pins those in the trainer instead)
        # with a registry, servers that join the job are used too (the job's pipeline only)
        elastic = dict(registry=cfg.registry, fingerprint=PipelineSpec(cfg.pipeline, cfg.pipeline_options).fingerprint()
                       ) if cfg.registry and job.mode == "heterogeneous" else {}
        return RemoteDataset(list(job.servers), job.token, connect_timeout=cfg.connect_timeout_s,
                             pin_memory=torch.cuda.is_available() and cfg.workers_for(job.mode) == 0, **elastic,
                             **common)
    from dnn_worker import LocalDataset
    return LocalDataset(PipelineSpec(cfg.pipeline, cfg.pipeline_options), **common)


def make_optimizer(cfg: LaunchConfig, params) -> torch.optim.Optimizer:
    cls = load_object(OPTIMIZERS.get(cfg.optimizer.lower(), cfg.optimizer), "optimizer")
    try:
        return cls(params, lr=cfg.lr)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"optimizer={cfg.optimizer!r} with lr={cfg.lr}: {exc}; use one of "
                          f"{sorted(OPTIMIZERS)} or an import path such as torch.optim:AdamW") from exc


def _tensorboard(job: TrainJob):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ConfigError(f"tensorboard=true needs the tensorboard package ({exc}); "
                          "pip install 'hetero-data-service[tensorboard]'") from exc
    return SummaryWriter(os.path.join(job.output_dir, "tensorboard"))


def _data_node_stats(job: TrainJob) -> list[dict]:
    from dnn_worker import ControlClient

    out = []
    for host, address in zip(job.server_hosts, job.servers):
        entry: dict[str, Any] = {"host": host, "role": "data", "address": address}
        try:
            with ControlClient(address, job.token, "trainer-metrics") as ctl:
                s = ctl.stats(timeout=5.0)
            entry.update(batches_sent=s.batches_sent, bytes_sent=s.bytes_sent, workers=s.workers,
                         worker_busy_fraction=s.worker_busy_fraction, batch_errors=s.batch_errors,
                         samples_skipped=s.samples_skipped)
        except Exception as exc:  # stats are informative; training already succeeded
            entry["error"] = f"{type(exc).__name__}: {exc}"
        out.append(entry)
    return out


def train(local_rank: int, job: TrainJob, results=None) -> dict[str, Any]:
    """Train on this rank; rank 0 writes the model, metrics.json and checkpoints. Returns this
    rank's summary (``status``: ``completed`` or ``stopped``), also put on ``results`` (a queue)
    as ``(local_rank, status)`` when given."""
    cfg = job.cfg
    rank = job.node_rank * job.nprocs + local_rank
    logs.setup("trainer", job.host, rank, cfg.log_level)
    if results is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)  # a spawned rank: the DNN node forwards SIGTERM
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        # intra-op threads share the node's CPUs with the other ranks and the loader workers
        builders = cfg.workers_for(job.mode)
        if job.mode == "homogeneous":
            builders += cfg.homogeneous_server_workers(job.nprocs)
        free = len(os.sched_getaffinity(0)) - builders
        torch.set_num_threads(max(1, free // job.nprocs))
    if job.world_size > 1 or cfg.ddp_backend != "auto":  # a chosen backend runs even on one rank
        from dnn_worker.ddp_backend import resolve_backend

        backend = resolve_backend(cfg.ddp_backend, cuda)
        dist.init_process_group(backend, init_method=f"tcp://{job.master_addr}:{cfg.master_port}",
                                rank=rank, world_size=job.world_size,
                                timeout=datetime.timedelta(seconds=cfg.dist_timeout_s))
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
    from dnn_worker import DeviceFeeder, ResumableLoader

    cfg = job.cfg
    started = time.time()
    torch.manual_seed(cfg.seed)
    cuda = device.type == "cuda"
    dataset = make_dataset(job, rank)
    finish = dataset.finish_stage()
    # forkserver, not fork: this process has used gRPC (Hello), and a forked child of a gRPC
    # process can deadlock on its first call. Persistent workers keep their connections to the
    # data servers from one epoch to the next.
    workers = cfg.workers_for(job.mode)
    loader = ResumableLoader(DataLoader(dataset, batch_size=None, num_workers=workers,
                                        pin_memory=cuda and workers > 0, persistent_workers=workers > 0,
                                        worker_init_fn=_ignore_sigterm if workers else None,
                                        multiprocessing_context="forkserver" if workers else None))
    feeder = DeviceFeeder(loader, device, finish=finish, depth=2, pin_memory=cuda)
    plain = load_object(cfg.model, "model")(**cfg.model_options).to(device)
    optimizer = make_optimizer(cfg, plain.parameters())
    resumed = _resume(job, rank, plain, optimizer, feeder)
    model = plain
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(plain, device_ids=[local_rank] if cuda else None)
    step_fn = None if cfg.emulate_step_s > 0 else load_object(cfg.step, "step")
    writer = _tensorboard(job) if cfg.tensorboard and rank == 0 else None
    advisor, autoscaler = advice_and_autoscaler(job, rank)
    stats = StepStats(cfg.warmup_steps, cfg.log_every, advisor=advisor, autoscaler=autoscaler)
    timer = StepTimer(stats)
    done_before = resumed["steps"] if resumed else 0
    loss = None
    stopped = False

    def steps_done() -> int:
        return done_before + stats.steps

    log.info("%s training: %d rank(s) on %d host(s), %s step, pipeline %s, finish stage %s on %s",
             job.mode, job.world_size, len(job.dnn_hosts),
             f"emulated {cfg.emulate_step_s}s" if step_fn is None else cfg.step, cfg.pipeline,
             finish.target or "none", device)
    first_epoch = True
    try:
        for epoch in range(feeder.epoch, cfg.epochs):
            if stopped or (cfg.max_steps and steps_done() >= cfg.max_steps):
                break
            feeder.set_epoch(epoch)
            bar = None
            if rank == 0 and sys.stderr.isatty():
                from tqdm import tqdm
                bar = tqdm(total=len(feeder), desc=f"epoch {epoch}", leave=False)
            batches = iter(feeder)
            try:
                if first_epoch:  # later epochs' set-up counts: an epoch boundary is part of the step after it
                    timer.restart()
                    first_epoch = False
                while not (cfg.max_steps and steps_done() >= cfg.max_steps):
                    if _stop_agreed(job, device):
                        stopped = True
                        break
                    try:
                        batch = timer.fetch(batches)
                    except StopIteration:
                        break
                    except Exception as exc:
                        if STOP.is_set() and job.world_size == 1:  # e.g. the data nodes were stopped too
                            log.warning("fetching a batch failed after SIGTERM (%s: %s); checkpointing what was "
                                        "trained", type(exc).__name__, exc)
                            stopped = True
                            break
                        raise
                    if step_fn is None:
                        time.sleep(cfg.emulated_step_s(steps_done()))
                    else:
                        loss = step_fn(model, batch, optimizer, device)
                    timer.done(batch_size_of(batch))
                    if bar is not None:
                        bar.update(1)
                    if writer is not None and loss is not None:
                        writer.add_scalar("loss", loss, steps_done())
                    if cfg.checkpoint_every and steps_done() % cfg.checkpoint_every == 0:
                        _checkpoint(job, rank, plain, optimizer, feeder, steps_done(), "running")
            finally:
                batches.close()  # ends this epoch's iteration (non-persistent workers stop here)
            if bar is not None:
                bar.close()
            log.info("epoch %d %s: %d steps so far%s", epoch, "stopped" if stopped else "done", steps_done(),
                     f", loss {loss:.4f}" if loss is not None else "")
    finally:
        # On every path, errors included: a failing run's traceback would otherwise keep the
        # loader alive, and its workers (which ignore SIGTERM) would hold the exit forever.
        loader.close()
    status = "stopped" if stopped else "completed"
    if stopped:
        log.warning("SIGTERM: stopped after step %d (%d this run); data position %s", steps_done(), stats.steps,
                    feeder.state_dict())
    elif resumed and stats.steps == 0:
        log.warning("the checkpoint in %s had nothing left to train (epochs=%d, max_steps=%d); raise epochs "
                    "to train more, or use another checkpoint_dir to start afresh", job.checkpoint_dir,
                    cfg.epochs, cfg.max_steps)
    ckpt_path = _checkpoint(job, rank, plain, optimizer, feeder, steps_done(), status)
    summary = dict(stats.summary(), rank=rank, host=job.host, status=status)
    summaries = [summary]
    if job.world_size > 1:
        summaries = [None] * job.world_size
        dist.all_gather_object(summaries, summary)
    if rank == 0:
        _finish(job, plain, device, summaries, loss, started, step_fn is None, status, resumed, ckpt_path,
                finish.wire.name if finish.wire is not None else "uint8")
    if writer is not None:
        writer.close()
    if job.world_size > 1:
        dist.barrier()
    return summary


def _stop_agreed(job: TrainJob, device: torch.device) -> bool:
    """True when any rank was asked to stop; every rank calls it at the same step, so all stop
    together (one tiny all-reduce per step when world_size > 1)."""
    local = STOP.is_set()
    if job.world_size == 1:
        return local
    flag = torch.tensor([1.0 if local else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _resume(job: TrainJob, rank: int, model, optimizer, data) -> dict[str, Any] | None:
    """Load model, optimizer and this rank's data position from the checkpoint, when there is one."""
    cfg = job.cfg
    if not cfg.checkpoint or not job.checkpoint_dir:
        return None
    ckpt = checkpoint.load(job.checkpoint_dir)
    path = checkpoint.checkpoint_path(job.checkpoint_dir)
    if ckpt is None:
        log.info("no checkpoint in %s: starting afresh", job.checkpoint_dir)
        return None
    checkpoint.check_compatible(ckpt, path, world_size=job.world_size, seed=cfg.seed, pipeline=cfg.pipeline,
                                pipeline_options=cfg.pipeline_options, model=cfg.model)
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ConfigError(f"checkpoint {path} does not fit model={cfg.model!r} / optimizer={cfg.optimizer!r} "
                          f"({exc}); resume with the same model and optimizer, or use another checkpoint_dir") from exc
    position = ckpt["data"][rank]
    data.load_state_dict(position)
    log.info("resuming from %s (%s, written by %s): %d steps done; epoch %d from batch %d of this rank's share",
             path, ckpt.get("status"), ckpt.get("host"), ckpt["steps"], position["epoch"], position["position"])
    return {"steps": int(ckpt["steps"]), "epoch": position["epoch"], "position": position["position"],
            "status": ckpt.get("status"), "path": path}


def _checkpoint(job: TrainJob, rank: int, model, optimizer, data, steps: int, status: str) -> str | None:
    """Every rank's data position to rank 0, which writes the checkpoint (a collective call)."""
    cfg = job.cfg
    if not cfg.checkpoint or not job.checkpoint_dir:
        return None
    mine = data.state_dict()
    states = [mine]
    if job.world_size > 1:
        states = [None] * job.world_size
        dist.all_gather_object(states, mine)
    if rank != 0:
        return None
    path = checkpoint.save(job.checkpoint_dir, {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "data": states, "steps": steps,
        "status": status, "world_size": job.world_size, "seed": cfg.seed, "pipeline": cfg.pipeline,
        "pipeline_options": dict(cfg.pipeline_options), "model_target": cfg.model, "epochs": cfg.epochs,
        "host": job.host, "job_name": job.extra.get("job_name", "")})
    log.info("checkpoint (%s) written to %s after %d steps; data position of rank 0: epoch %d, batch %d",
             status, path, steps, states[0]["epoch"], states[0]["position"])
    return path


def _finish(job: TrainJob, plain, device, summaries, loss, started: float, emulated: bool, status: str,
            resumed: dict | None, ckpt_path: str | None, wire: str = "uint8") -> None:
    cfg = job.cfg
    stopped = status == "stopped"
    accuracy = None
    if cfg.evaluate and not emulated and not stopped:  # a stop has ~120 s: no evaluation
        accuracy = load_object(cfg.evaluate, "evaluate")(plain, device)
    os.makedirs(job.model_dir, exist_ok=True)
    torch.save(plain.state_dict(), os.path.join(job.model_dir, "model.pt"))  # also when stopped: an artifact
    data_nodes = _data_node_stats(job) if job.mode == "heterogeneous" and not stopped else []
    metrics = job_metrics(summaries, {
        "mode": job.mode, "step_kind": "emulated" if emulated else "real",
        "emulate_step_s": cfg.emulate_step_s if emulated else None, "test_accuracy": accuracy,
        "final_loss": loss, "world_size": job.world_size,
        "ddp_backend": dist.get_backend() if dist.is_initialized() else None, "epochs": cfg.epochs, "seed": cfg.seed,
        "pipeline": cfg.pipeline, "pipeline_options": cfg.pipeline_options, "wire_encoding": wire, "model": cfg.model,
        "dnn_hosts": list(job.dnn_hosts), "data_servers": list(job.servers),
        "wall_time_s": time.time() - started, "nodes": data_nodes, "status": status,
        "resumed_from_steps": resumed["steps"] if resumed else None, "checkpoint": ckpt_path, **job.extra})
    write_json(os.path.join(job.output_dir, "metrics.json"), metrics)
    log.info("%s", summary_line(metrics, job.output_dir))  # read by the job's MetricDefinitions
