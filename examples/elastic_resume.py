"""A user's training script under torchrun, resumable at any world size.

Every rank reads with ``RemoteDataset`` through a ``ResumableLoader``, steps in lockstep (one
all-reduce per step, as DDP does), and at ``--stop-at`` steps all ranks' data states are gathered
into one checkpoint file. Started again by torchrun with another ``--nproc-per-node`` (a new world
after a rendezvous), each rank loads the list of every old rank's state: the rest of the epoch
is dealt to the new ranks. One audit log per run and rank (``<audit-dir>/<run>-rank<r>.jsonl``).
"""
from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from dnn_worker import RemoteDataset, ResumableLoader


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--servers", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--tag", required=True, help="names the audit logs of this run")
    p.add_argument("--audit-dir", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--stop-at", type=int, default=0, help="steps, then checkpoint and exit (0: to the end)")
    p.add_argument("--step-s", type=float, default=0.0)
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    ds = RemoteDataset(args.servers.split(","), args.token, seed=args.seed, rank=rank, world_size=world,
                       audit_path=Path(args.audit_dir) / f"{args.tag}-rank{rank}.jsonl", epochs=args.epochs,
                       connect_timeout=60.0, batch_timeout=20.0)
    loader = ResumableLoader(DataLoader(ds, batch_size=None, num_workers=0))
    if os.path.exists(args.ckpt):
        loader.load_state_dict(torch.load(args.ckpt, weights_only=False)["data"])
    steps = 0
    try:
        for epoch in range(loader.epoch, args.epochs):
            loader.set_epoch(epoch)
            for _ in loader:
                time.sleep(args.step_s)
                dist.all_reduce(torch.ones(1))
                steps += 1
                if steps == args.stop_at:
                    save(args.ckpt, loader.state_dict(), rank, world)
                    return 0
        save(args.ckpt, loader.state_dict(), rank, world)
        print(f"rank {rank} of {world}: {steps} steps", flush=True)
        return 0
    finally:
        loader.close()
        dist.destroy_process_group()


def save(path: str, mine: dict, rank: int, world: int) -> None:
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        torch.save({"data": every}, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    dist.barrier()


if __name__ == "__main__":
    raise SystemExit(main())
