"""A consumer's list of batches as arithmetic: same batches as the lists, nothing held per batch."""
from __future__ import annotations

import random
import tracemalloc

import pytest

from data_service.contract.batch_id import BatchId
from data_service.errors import ConfigError
from data_service.contract.sampler import rank_share
from data_service.protocol.generated import pb
from dnn_worker import RemoteDataset
from dnn_worker import remote_dataset as remote_dataset_module
from dnn_worker.fetch.affinity import Affinity
from dnn_worker.resume.batch_list import BatchList, Stride, rank_stride
from dnn_worker.fetch.scheduler import Scheduler

BIG_EPOCH = 10_000_000  # batches of the epoch whose consumer start is measured


@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_a_rank_stride_is_the_rank_share_and_its_worker_parts_find_every_batch(remainder):
    for n in (1, 7, 13, 64, 101):
        for world in (1, 2, 3, 8):
            for rank in range(world):
                try:
                    want = rank_share(n, rank, world, remainder)
                except ConfigError:
                    with pytest.raises(ConfigError):
                        rank_stride(n, rank, world, remainder)
                    continue
                got = rank_stride(n, rank, world, remainder)
                assert list(got) == want and [got[i] for i in range(len(got))] == want and got.unique()
                for start in (0, 1, len(want) // 2):
                    for workers in (1, 2, 3):
                        for w in range(workers):
                            part, expect = got[start:][w::workers], want[start:][w::workers]
                            assert list(part) == expect
                            assert [part.index(v) for v in expect] == list(range(len(expect)))
                            assert [v for v in range(n) if v in part] == sorted(expect)


def test_a_stride_that_wraps_onto_itself_is_not_unique_and_finds_the_first():
    s = Stride(0, 2, 5, 6)
    assert list(s) == [0, 2, 4, 0, 2] and not s.unique() and s.index(2) == 1
    with pytest.raises(ValueError):
        s.index(3)
    with pytest.raises(ConfigError, match="unique"):
        Scheduler(BatchList(1, [(0, s)]))


def test_a_batch_list_slices_and_joins_the_next_epoch_like_a_list():
    share = rank_stride(50, 1, 3)
    items = BatchList(9, [(4, share)])
    plain = [BatchId(9, 4, i) for i in share]
    ahead = BatchList(9, [(5, share[:3])])
    for ready in (0, 1, 7, len(plain)):
        joined = items[ready:] + ahead
        expect = plain[ready:] + [BatchId(9, 5, i) for i in list(share)[:3]]
        assert list(joined) == expect and len(joined) == len(expect) and list(items[:ready]) == plain[:ready]
        assert [joined.index_of(b) for b in expect] == list(range(len(expect)))
        assert [joined[j] for j in range(len(joined))] == expect
    with pytest.raises(KeyError):
        items.index_of(BatchId(8, 4, share[0]))  # another seed
    assert BatchList(0, [(0, [3, 1]), (1, [2])]).index_of(BatchId(0, 1, 2)) == 2


def _drive(sched: Scheduler, seed: int) -> list:
    """A fixed random run of plans, arrivals, a lost server and a declined batch; what was asked."""
    rng = random.Random(seed)
    for address, window in (("a:1", 4), ("b:1", 6), ("c:1", 3)):
        sched.lanes.lane(address, window, float(window))
    usable, log, nxt, got = ["a:1", "b:1", "c:1"], [], 0, set()
    for turn in range(400):
        now = turn * 0.01
        orders = sched.plan(nxt, usable, tuple(usable), now)
        log.append(sorted((a, list(batches)) for a, batches in orders.fetch.items()))
        log.append(sorted((a, list(batches)) for a, batches in orders.hint.items()))
        for address in list(usable):
            owed = list(sched.lanes[address].outstanding)
            for ref in owed[:rng.randint(0, len(owed))]:
                if turn == 50 and address == "b:1":
                    sched.declined(address, ref, requeue=True)
                elif sched.arrived(address, ref, 1 << 21, now):
                    got.add(sched.batches.index_of(ref))
        if turn == 120:
            log.append(sched.lost("c:1"))
            usable.remove("c:1")
            sched.lanes.pop("c:1")
        while nxt in got:
            nxt += 1
        if nxt >= len(sched.batches):
            break
    log.append((nxt, sched.hedges, sched.failovers, list(sched.todo)[:50]))
    return log


@pytest.mark.parametrize("block_samples", [0, 64])
def test_the_scheduler_asks_the_same_of_a_computed_list_as_of_a_plain_one(block_samples):
    info = pb.DatasetInfo(num_samples=8 * 700, batch_size=8, drop_last=True, shuffle=True,
                          block_samples=block_samples, interleave=2, fingerprint="fp")
    share = rank_stride(700, 1, 2)[3:]
    computed = BatchList(7, [(2, share), (3, rank_stride(700, 1, 2)[:4])])
    plain = list(computed)
    assert plain == [BatchId(7, 2, i) for i in share] + [BatchId(7, 3, i) for i in (1, 3, 5, 7)]
    logs = [_drive(Scheduler(refs, affinity=Affinity.of(info)), 3) for refs in (plain, computed)]
    assert logs[0] == logs[1]
    assert logs[0][-1][0] == len(plain), "the run delivers the whole list"


def test_a_consumer_starts_an_epoch_of_ten_million_batches_holding_nothing_per_batch(monkeypatch):
    made = []

    class Unstarted(remote_dataset_module.Fetcher):
        def __iter__(self):  # the scheduler is built; no server is asked
            made.append(self._scheduler)
            return iter(())

    monkeypatch.setattr(remote_dataset_module, "Fetcher", Unstarted)
    ds = RemoteDataset(["127.0.0.1:1"], token="t", seed=3, rank=1, world_size=2)
    ds._info = pb.HelloResponse(dataset=pb.DatasetInfo(
        num_samples=2 * BIG_EPOCH * 32, batch_size=32, shuffle=True, block_samples=32 * 1024, interleave=4,
        fingerprint="fp", wire_encoding="raw"))
    tracemalloc.start()
    try:
        for _ in ds:  # (not list(ds): list() would make room for len(ds) items first)
            raise AssertionError("no batch was asked for")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    sched = made[0]
    assert len(sched.batches) == BIG_EPOCH and sched.todo[0] == BatchId(3, 0, 1)
    assert sched.batches.index_of(BatchId(3, 0, 2 * BIG_EPOCH - 1)) == BIG_EPOCH - 1
    assert peak < 2 << 20, f"starting the epoch took {peak / 2**20:.1f} MiB (a list of its batches: GBs)"
