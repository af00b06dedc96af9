"""The training loop of one rank: data from data servers (or in-process), DDP, metrics.

``train(local_rank, job)`` is what the DNN node runs once per local GPU (or once on CPU).
What it trains is pluggable by import path (``model``, ``step``, ``evaluate``,
``optimizer`` options); ``emulate_step_s`` replaces the step by a sleep of that length, an
*emulated accelerator step* for measuring the data path on machines without a GPU; metrics
then say ``"step_kind": "emulated"``.
"""
from __future__ import annotations

import datetime
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from data_service.errors import ConfigError
from data_service.pipeline import PipelineSpec

from . import logs
from .config import LaunchConfig, load_object
from .metrics import StepStats, StepTimer, batch_size_of, job_metrics, write_json

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
    extra: dict = field(default_factory=dict, hash=False)

    @property
    def world_size(self) -> int:
        return self.nprocs * len(self.dnn_hosts)


def make_dataset(job: TrainJob, rank: int):
    cfg = job.cfg
    common = dict(seed=cfg.seed, rank=rank, world_size=job.world_size, audit_path=cfg.audit_path or None)
    if job.mode == "heterogeneous":
        from dnn_worker import RemoteDataset
        return RemoteDataset(list(job.servers), job.token, connect_timeout=cfg.connect_timeout_s,
                             pin_memory=torch.cuda.is_available(), **common)
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
                         worker_busy_fraction=s.worker_busy_fraction, batch_errors=s.batch_errors)
        except Exception as exc:  # stats are informative; training already succeeded
            entry["error"] = f"{type(exc).__name__}: {exc}"
        out.append(entry)
    return out


def train(local_rank: int, job: TrainJob) -> dict[str, Any]:
    """Train on this rank; rank 0 writes the model and metrics.json. Returns this rank's summary."""
    cfg = job.cfg
    rank = job.node_rank * job.nprocs + local_rank
    logs.setup("trainer", job.host, rank, cfg.log_level)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        # intra-op threads share the node's CPUs with the other ranks and the loader workers
        free = len(os.sched_getaffinity(0)) - cfg.loader_workers
        torch.set_num_threads(max(1, free // job.nprocs))
    if job.world_size > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{job.master_addr}:{cfg.master_port}",
                                rank=rank, world_size=job.world_size,
                                timeout=datetime.timedelta(seconds=cfg.dist_timeout_s))
    try:
        return _train(job, rank, local_rank, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(job: TrainJob, rank: int, local_rank: int, device: torch.device) -> dict[str, Any]:
    cfg = job.cfg
    started = time.time()
    torch.manual_seed(cfg.seed)
    dataset = make_dataset(job, rank)
    loader = DataLoader(dataset, batch_size=None, num_workers=cfg.loader_workers,
                        pin_memory=device.type == "cuda")
    model = load_object(cfg.model, "model")(**cfg.model_options).to(device)
    if job.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = make_optimizer(cfg, model.parameters())
    step_fn = None if cfg.emulate_step_s > 0 else load_object(cfg.step, "step")
    writer = _tensorboard(job) if cfg.tensorboard and rank == 0 else None
    stats = StepStats(cfg.warmup_steps, cfg.log_every)
    timer = StepTimer(stats)
    loss = None
    log.info("%s training: %d rank(s) on %d host(s), %s step, pipeline %s",
             job.mode, job.world_size, len(job.dnn_hosts),
             f"emulated {cfg.emulate_step_s}s" if step_fn is None else cfg.step, cfg.pipeline)
    for epoch in range(cfg.epochs):
        dataset.set_epoch(epoch)
        total = len(dataset)
        bar = None
        if rank == 0 and sys.stderr.isatty():
            from tqdm import tqdm
            bar = tqdm(total=total, desc=f"epoch {epoch}", leave=False)
        iterator = iter(loader)
        timer.restart()
        while not (cfg.max_steps and stats.steps >= cfg.max_steps):
            try:
                batch = timer.fetch(iterator)
            except StopIteration:
                break
            if step_fn is None:
                time.sleep(cfg.emulate_step_s)
            else:
                loss = step_fn(model, batch, optimizer, device)
            timer.done(batch_size_of(batch))
            if bar is not None:
                bar.update(1)
            if writer is not None and loss is not None:
                writer.add_scalar("loss", loss, stats.steps)
        del iterator
        if bar is not None:
            bar.close()
        log.info("epoch %d done: %d steps so far%s", epoch, stats.steps, f", loss {loss:.4f}" if loss is not None else "")
        if cfg.max_steps and stats.steps >= cfg.max_steps:
            break
    summary = dict(stats.summary(), rank=rank, host=job.host)
    summaries = [summary]
    if job.world_size > 1:
        summaries = [None] * job.world_size
        dist.all_gather_object(summaries, summary)
    if rank == 0:
        _finish(job, model, device, summaries, loss, started, step_fn is None)
    if writer is not None:
        writer.close()
    if job.world_size > 1:
        dist.barrier()
    return summary


def _finish(job: TrainJob, model, device, summaries, loss, started: float, emulated: bool) -> None:
    cfg = job.cfg
    plain = model.module if hasattr(model, "module") else model
    accuracy = None
    if cfg.evaluate and not emulated:
        accuracy = load_object(cfg.evaluate, "evaluate")(plain, device)
    os.makedirs(job.model_dir, exist_ok=True)
    torch.save(plain.state_dict(), os.path.join(job.model_dir, "model.pt"))
    data_nodes = _data_node_stats(job) if job.mode == "heterogeneous" else []
    metrics = job_metrics(summaries, {
        "mode": job.mode, "step_kind": "emulated" if emulated else "real",
        "emulate_step_s": cfg.emulate_step_s if emulated else None, "test_accuracy": accuracy,
        "final_loss": loss, "world_size": job.world_size, "epochs": cfg.epochs, "seed": cfg.seed,
        "pipeline": cfg.pipeline, "pipeline_options": cfg.pipeline_options, "model": cfg.model,
        "dnn_hosts": list(job.dnn_hosts), "data_servers": list(job.servers),
        "wall_time_s": time.time() - started, "nodes": data_nodes, **job.extra})
    write_json(os.path.join(job.output_dir, "metrics.json"), metrics)
    log.info("done: avg step time %s s (%s), data wait %s, %s samples/s, test accuracy %s; metrics in %s",
             _fmt(metrics["avg_step_time_s"]), metrics["step_kind"], _fmt(metrics["data_wait_fraction"]),
             _fmt(metrics["samples_per_s"]), _fmt(accuracy), job.output_dir)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"
