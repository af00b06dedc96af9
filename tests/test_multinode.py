"""Many servers x many ranks: same bytes for every cluster shape, failover, rejoin, resume, balance."""
from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp_mp
from torch.utils.data import DataLoader

from conftest import TOKEN, start_server
from data_service.contract.tensor_layout import batch_digest
from data_service.contract.pipeline import PipelineSpec
from dnn_worker import ControlClient, LocalDataset, RemoteDataset, ResumableLoader
from dnn_worker.resume.state import VERSION
from hetero.testing import FaultProxy, free_port, read_audit

OPTS = {"size": 96, "batch_size": 4}  # 24 batches per epoch
SPEC = PipelineSpec("examples.synthetic:build_pipeline", OPTS)


def reference(seed=0, epoch=0):
    ds = LocalDataset(SPEC, seed=seed)
    ds.set_epoch(epoch)
    return [batch_digest(b) for b in ds]


@pytest.fixture(scope="module")
def two_servers():
    servers = [start_server(OPTS, num_workers=1) for _ in range(2)]
    yield servers
    for s in servers:
        s.shutdown(grace_s=2)


@pytest.mark.parametrize("nservers, world", [(1, 1), (2, 2), (2, 4), (1, 3)])
def test_every_cluster_shape_gives_the_same_batches(two_servers, tmp_path, nservers, world):
    ref = reference(seed=3, epoch=1)
    audit = tmp_path / "audit.jsonl"
    addresses = [s.address for s in two_servers[:nservers]]
    for rank in range(world):
        ds = RemoteDataset(addresses, TOKEN, seed=3, rank=rank, world_size=world, audit_path=audit)
        ds.set_epoch(1)
        list(ds)
    rows = read_audit(audit)
    per_rank = {r: [x for x in rows if x["rank"] == r] for r in range(world)}
    assert len({len(v) for v in per_rank.values()}) == 1  # equal step counts
    assert len(rows) == 24 // world * world
    assert len({x["batch"] for x in rows}) == len(rows)  # exactly once
    assert all(x["sha256"] == ref[x["batch"]] for x in rows)  # same bytes as in-process
    assert all(x["batch"] % world == r for r, v in per_rank.items() for x in v)


def test_data_parallel_groups_share_batches(two_servers):
    # TP=2 x DP=2: ranks 0,1 form replica 0 and must see identical batches.
    got = [[batch_digest(b) for b in RemoteDataset([two_servers[0].address], TOKEN, rank=r, world_size=4,
                                                      dp_rank=r // 2, dp_size=2)] for r in range(4)]
    assert got[0] == got[1] and got[2] == got[3] and got[0] != got[2]


@pytest.mark.slow
def test_server_killed_mid_epoch_its_batches_come_from_the_others(server_process, tmp_path):
    opts = {"size": 96, "batch_size": 4, "work_ms": 15}  # ~60 ms per batch per worker
    a, b = server_process(opts).start(), server_process(opts).start()
    audit = tmp_path / "audit.jsonl"
    ds = RemoteDataset([a.address, b.address], TOKEN, window=3, audit_path=audit, connect_timeout=10)
    got = []
    for batch in ds:
        got.append(batch_digest(batch))
        if len(got) == 6:
            a.kill()  # kill -9, mid-epoch, with requests outstanding
    assert got == reference()
    rows = read_audit(audit)
    assert sorted(x["batch"] for x in rows) == list(range(24))


@pytest.mark.slow  # test_faults.py kills and restarts a server mid-epoch by default
def test_restarted_server_is_used_again(server_process):
    opts = {"size": 96, "batch_size": 4, "work_ms": 15}
    a, b = server_process(opts).start(), server_process(opts).start()
    ds = RemoteDataset([a.address, b.address], TOKEN, window=2, connect_timeout=20)
    ds.set_epoch(0)
    it = iter(ds)
    got = [batch_digest(next(it)) for _ in range(3)]
    a.kill()
    a.start()  # same address, new process
    got += [batch_digest(x) for x in it]
    assert got == reference()
    with ControlClient(a.address, TOKEN) as ctl:
        assert ctl.stats().batches_sent > 0  # the new process served part of the epoch


@pytest.mark.slow
def test_late_server_is_waited_for(server_process):
    late = server_process({"size": 96, "batch_size": 4})
    threading.Timer(2.0, late.start, kwargs={"wait": False}).start()
    start = time.monotonic()
    got = [batch_digest(b) for b in RemoteDataset([late.address], TOKEN, connect_timeout=60)]
    assert got == reference() and time.monotonic() - start >= 2.0


def test_resume_mid_epoch_with_a_different_number_of_servers(two_servers):
    first = ResumableLoader(DataLoader(RemoteDataset([two_servers[0].address], TOKEN, seed=1, rank=0, world_size=2),
                                       batch_size=None, num_workers=2, multiprocessing_context="spawn"))
    first.set_epoch(2)
    seen = []
    for batch in first:
        seen.append(batch_digest(batch))
        if len(seen) == 5:
            state = first.state_dict()  # "SIGTERM": stop after 5 steps
            break
    assert state == {"version": VERSION, "epoch": 2, "seed": 1, "position": 5, "dp_rank": 0, "dp_size": 2}
    resumed = ResumableLoader(DataLoader(RemoteDataset([s.address for s in two_servers], TOKEN, seed=1, rank=0,
                                                       world_size=2), batch_size=None))
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    seen += [batch_digest(b) for b in resumed]
    assert seen == reference(seed=1, epoch=2)[0::2]  # rank 0's share, nothing repeated or skipped


@pytest.mark.slow
def test_a_slow_server_gets_less_work():
    bulk = free_port()
    proxy = FaultProxy(("127.0.0.1", bulk), delay_s=0.05)  # 50 ms per chunk on the slow link
    slow = start_server(OPTS, num_workers=1, bulk_port=bulk, advertise_bulk_port=proxy.port)
    fast = start_server(OPTS, num_workers=1)
    try:
        got = [batch_digest(b) for b in RemoteDataset([slow.address, fast.address], TOKEN, window=2)]
        assert got == reference()
        n_slow, n_fast = (s.stats.snapshot().batches_sent - 1 for s in (slow, fast))
        assert n_fast > 2 * n_slow, (n_fast, n_slow)
    finally:
        proxy.close()
        slow.shutdown(grace_s=1)
        fast.shutdown(grace_s=1)


def _ddp_consumer(rank, world, init, address, audit):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        ds = RemoteDataset([address], TOKEN, seed=7, audit_path=audit)  # rank/world from torch.distributed
        loader = DataLoader(ds, batch_size=None)
        for _ in loader:
            pass
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_ranks_over_gloo_get_equal_disjoint_shares(two_servers, tmp_path):
    audit = str(tmp_path / "audit.jsonl")
    init = f"tcp://127.0.0.1:{free_port()}"
    tmp_mp.spawn(_ddp_consumer, args=(3, init, two_servers[1].address, audit), nprocs=3, join=True)
    rows = read_audit(audit)
    ref = reference(seed=7)
    assert sorted(x["batch"] for x in rows) == list(range(24))
    assert [sum(x["rank"] == r for x in rows) for r in range(3)] == [8, 8, 8]
    assert all(ref[x["batch"]] == x["sha256"] for x in rows)
