"""The Lightning DataModule with a real ``lightning.Trainer`` on CPU: fit across two epochs, stop
mid-epoch, resume from Lightning's own checkpoint, every batch trained exactly once (audit log);
the same as a two-node DDP job (gloo)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from conftest import ROOT  # noqa: E402
from hetero.ports import free_port  # noqa: E402
from data_service.contract.tensor_layout import batch_digest  # noqa: E402
from data_service.contract.pipeline import PipelineSpec  # noqa: E402
from dnn_worker import LocalDataset  # noqa: E402

import _lightning_job as job  # noqa: E402

OPTS = {"size": 48, "batch_size": 4, "shape": [1, 6, 6]}  # 12 batches per epoch


def reference(rank: int = 0, world: int = 1) -> list[tuple[int, int, str]]:
    ds = LocalDataset(PipelineSpec("examples.synthetic:build_pipeline", OPTS), seed=2, rank=rank, world_size=world)
    out = []
    for epoch in range(job.EPOCHS):
        ds.set_epoch(epoch)
        out += [(epoch, i, batch_digest(b)) for i, b in zip(ds.rank_indices(), ds)]
    return out


def audit(path: Path, rank: int = 0) -> list[tuple[int, int, str]]:
    lines = map(json.loads, path.read_text().splitlines()) if path.exists() else []
    return [(e["epoch"], e["batch"], e["sha256"]) for e in lines if e["rank"] == rank]


def test_datamodule_serves_remote_batches_sharded_by_rank(server_factory):
    from dnn_worker.lightning import RemoteDataModule

    server = server_factory({"size": 64, "batch_size": 8})
    dm = RemoteDataModule([server.address], token="test-token", seed=0, loader_workers=0)
    dm.setup("fit")
    assert len(dm.train_dataloader()) == 8 == len(list(dm.train_dataloader()))


def test_the_homogeneous_datamodule_gives_the_remote_ones_batches(server_factory):
    """LocalDataModule (the homogeneous mode) builds in this process the batches RemoteDataModule
    reads from a data server: the same ones, bit for bit, in the same order."""
    from dnn_worker.lightning import LocalDataModule, RemoteDataModule

    options = {"size": 64, "batch_size": 8}
    server = server_factory(options)
    remote = RemoteDataModule([server.address], token="test-token", seed=3, loader_workers=0)
    local = LocalDataModule(PipelineSpec("examples.synthetic:build_pipeline", options), seed=3, loader_workers=0)
    digests = []
    for dm in (remote, local):
        dm.setup("fit")
        digests.append([batch_digest(b) for b in dm.train_dataloader()])
    assert len(digests[0]) == 8 and digests[0] == digests[1]


# mid-epoch 0 (the resume crosses the epoch boundary) and mid-epoch 1; a loader without len makes
# Lightning fetch a batch ahead of the step, which the module's position must not count
@pytest.mark.parametrize("stop_at, sized", [(5, True), (17, True), (7, False)])
@pytest.mark.slow
def test_trainer_stops_mid_epoch_and_resumes_from_its_checkpoint_exactly_once(server_factory, tmp_path, stop_at,
                                                                                 sized):
    server = server_factory(OPTS, num_workers=1)
    log = tmp_path / "audit.jsonl"
    assert job.fit(server.address, str(log), str(tmp_path), stop_at, sized=sized) == stop_at + 2
    first = audit(log)
    ref = reference()
    assert first == ref[:stop_at + 2]  # two steps trained after the checkpoint: lost on resume
    assert job.fit(server.address, str(log), str(tmp_path), 0, sized=sized) == len(ref)
    assert first[:stop_at] + audit(log)[len(first):] == ref


@pytest.mark.slow  # four interpreter starts that import Lightning: about a minute on 2 cores
def test_two_node_ddp_job_resumes_exactly_once(server_factory, tmp_path):
    server = server_factory(OPTS, num_workers=1)
    log = tmp_path / "audit.jsonl"

    def run(stop_at: int) -> None:
        port = str(free_port())
        procs = []
        for node in range(2):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(node), LOCAL_RANK="0",
                       WORLD_SIZE="2", PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
            procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "_lightning_job.py"), server.address,
                                           str(log), str(tmp_path), str(stop_at)], env=env, cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for p in procs:
            out, _ = p.communicate(timeout=180)
            assert p.returncode == 0, out[-3000:]

    run(4)
    first = {r: audit(log, r) for r in (0, 1)}
    run(0)
    for rank in (0, 1):
        ref = reference(rank, 2)
        assert first[rank] == ref[:6]
        assert first[rank][:4] + audit(log, rank)[len(first[rank]):] == ref, f"rank {rank}"


@pytest.mark.slow  # two interpreter starts that import Lightning
def test_a_one_device_checkpoint_resumes_on_two_nodes_with_the_rest_dealt(server_factory, tmp_path):
    server = server_factory(OPTS, num_workers=1)
    first_log, second_log = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    assert job.fit(server.address, str(first_log), str(tmp_path), 5) == 7  # checkpoint at 5, 2 steps lost
    trained = [b for e, b, _ in audit(first_log)[:5]]
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "_lightning_job.py"), server.address,
                               str(second_log), str(tmp_path), "0"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(node),
                                       LOCAL_RANK="0", WORLD_SIZE="2", PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}"))
             for node in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out[-3000:]
    ref = {(e, b): sha for e, b, sha in reference()}
    after = {rank: audit(second_log, rank) for rank in (0, 1)}
    epoch0 = [b for rank in (0, 1) for e, b, _ in after[rank] if e == 0]
    assert len(after[0]) == len(after[1])  # equal counts: DDP never waits on a short rank
    assert sorted(trained + epoch0) == list(range(11)) and len(epoch0) == 6  # 7 left, 3 each, the last dropped
    for rank in (0, 1):
        assert [b for e, b, _ in after[rank] if e == 1] == list(range(rank, 12, 2))  # then shared as usual
        assert all(ref[(e, b)] == sha for e, b, sha in after[rank])


@pytest.mark.slow  # an interpreter start that imports Lightning
def test_a_ddp_job_leaves_no_gloo_group_open_at_exit(server_factory, tmp_path):
    # Lightning never destroys its process group; gloo's unjoined threads then abort the process at
    # exit now and then (-6). The module destroys it at exit: a hook registered before the fit runs
    # after the module's and sees the group gone.
    server = server_factory(OPTS, num_workers=1)
    script = ("import atexit, sys, torch.distributed as dist\n"
              "atexit.register(lambda: print('group open at exit:', dist.is_initialized()))\n"
              "import _lightning_job as job\n"
              f"job.fit({server.address!r}, {str(tmp_path / 'audit.jsonl')!r}, {str(tmp_path)!r}, 0, strategy='ddp')\n")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "group open at exit: False" in done.stdout, done.stdout[-2000:]
