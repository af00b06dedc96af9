"""A training loop over one consumer composition, run in a fresh process by the contract tests.

``python tests/_consumer_scenario.py`` is a zygote: it imports torch and the consumer once, then
forks one fresh process per JSON job read from stdin and answers with its exit status, so each
run and each resume starts with no state but the checkpoint file (and costs milliseconds, not an
interpreter start). Loader workers use "fork": the scenario process has made no gRPC call
before they start (the data server's Hello comes cached from the test).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import traceback

import torch
from torch.utils.data import DataLoader

from data_service.contract.pipeline import PipelineSpec
from data_service.protocol.generated import pb
from dnn_worker import DeviceFeeder, LocalDataset, RemoteDataset, ResumableLoader

PIPELINE = "examples.synthetic:build_finished_pipeline"
OPTS = {"size": 40, "batch_size": 4, "shape": [1, 6, 6], "finish_on": "device"}  # 10 batches per epoch
TOKEN = "test-token"


def build(job: dict) -> tuple[DeviceFeeder, ResumableLoader]:
    kw = dict(seed=job["seed"], rank=job["rank"], world_size=job["world"], audit_path=job["audit"],
              epochs=job["epochs"])  # the next epoch's first batches are fetched ahead
    if job["kind"] == "local":
        ds = LocalDataset(PipelineSpec(PIPELINE, OPTS), **kw)
    else:
        ds = RemoteDataset([job["server"]], TOKEN, **kw)
        ds._info = pb.HelloResponse.FromString(bytes.fromhex(job["hello"]))
    workers = job["workers"]
    loader = ResumableLoader(DataLoader(ds, batch_size=None, num_workers=workers,
                                        persistent_workers=bool(job["persistent"] and workers),
                                        multiprocessing_context="fork" if workers else None))
    return DeviceFeeder(loader, "cpu", finish=ds.finish_stage(), depth=job["depth"]), loader


def save(path: str, state: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run(job: dict) -> None:
    """Train ``job["epochs"]`` epochs from the checkpoint (if any); stop after ``stop_after``
    batches of this run (checkpoint, or kill -9 when ``kill``); checkpoint every ``every``."""
    feeder, loader = build(job)
    steps = 0
    if os.path.exists(job["ckpt"]):
        with open(job["ckpt"]) as f:
            ckpt = json.load(f)
        feeder.load_state_dict(ckpt["data"])
        steps = ckpt["steps"]
    stop_after, n = job.get("stop_after"), 0
    try:
        for epoch in range(feeder.epoch, job["epochs"]):
            if n == stop_after:
                break
            feeder.set_epoch(epoch)
            batches = iter(feeder)
            try:
                for batch in batches:
                    assert batch["image"].dtype == torch.float32  # finished ahead, on the "device"
                    n += 1
                    if job.get("every") and (steps + n) % job["every"] == 0:
                        save(job["ckpt"], {"data": feeder.state_dict(), "steps": steps + n})
                    if n == stop_after:
                        if job.get("kill"):
                            os.kill(os.getpid(), signal.SIGKILL)
                        break
            finally:
                batches.close()
        if not job.get("kill"):
            save(job["ckpt"], {"data": feeder.state_dict(), "steps": steps + n})
    finally:
        loader.close()


def zygote() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            try:
                run(job)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        sys.stdout.write(json.dumps({"rc": rc}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    zygote()
