"""The block-shuffled plan at scale: batch i's block found without a table of every batch of the epoch."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from data_service.contract.batch_id import BatchId
from data_service.contract.sampler import EpochShape, batch_block, batch_indices, derive_seed


def _rows(cfg: EpochShape, seed: int, epoch: int) -> list[tuple[int, int]]:
    """(block, batch within it) of every batch: the plan written out in full, as a reference."""
    rng = np.random.Generator(np.random.PCG64(derive_seed(seed, epoch, 0xB10C)))
    blocks = rng.permutation(cfg.num_blocks)
    last = cfg.num_blocks - 1
    per_block = cfg.block_samples // cfg.batch_size
    last_full = (cfg.num_samples - last * cfg.block_samples) // cfg.batch_size
    rows = []
    for g in range(0, len(blocks), cfg.interleave):
        group = blocks[g:g + cfg.interleave]
        counts = [last_full if b == last else per_block for b in group]
        for k in range(max(counts, default=0)):
            rows.extend((int(b), k) for b, n in zip(group, counts) if k < n)
    if cfg.num_batches > len(rows):
        rows.append((last, last_full))
    return rows


@pytest.mark.parametrize("n, batch, block, interleave, drop_last", [
    (1000, 8, 64, 4, False), (1000, 8, 64, 4, True), (96, 8, 32, 8, False), (50, 5, 50, 1, False),
    (1003, 4, 16, 3, False), (1003, 4, 16, 3, True), (1001, 10, 20, 7, False), (7, 4, 4, 2, False),
    (4097, 16, 256, 5, False), (12, 4, 4, 1, True), (130, 8, 64, 2, False), (129, 8, 64, 2, True),
])
def test_every_batch_is_where_the_full_table_puts_it(n, batch, block, interleave, drop_last):
    cfg = EpochShape(n, batch, drop_last, True, block, interleave)
    for seed, epoch in ((0, 0), (7, 3), (123, 1)):
        rows = _rows(cfg, seed, epoch)
        assert len(rows) == cfg.num_batches
        assert [batch_block(cfg, seed, epoch, i) for i in range(cfg.num_batches)] == [b for b, _ in rows]
        for i in range(cfg.num_batches):
            b, k = rows[i]
            got = batch_indices(cfg, seed, epoch, i)
            assert min(got) >= b * block and max(got) < (b + 1) * block


def test_a_batch_of_a_100_million_sample_plan_costs_no_table_of_batches():
    cfg = EpochShape(100_000_000, 32, False, True, 1024, 4)
    tracemalloc.start()
    last = batch_indices(cfg, 5, 0, cfg.num_batches - 1)
    some = batch_block(cfg, 5, 0, 1_234_567)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(last) == 100_000_000 % 32 or len(last) == 32
    assert 0 <= some < cfg.num_blocks
    assert peak < 4 * cfg.num_blocks * 8 + (1 << 20), peak  # the block order (8 bytes a block), not 3 M batches


def test_a_consumer_s_scheduler_finds_block_openers_as_it_goes_not_for_the_whole_epoch_at_start():
    from data_service.protocol.generated import pb
    from dnn_worker.fetch.affinity import Affinity
    from dnn_worker.fetch.scheduler import Scheduler

    aff = Affinity(pb.DatasetInfo(num_samples=1 << 20, batch_size=8, drop_last=True, shuffle=True,
                                  block_samples=64, interleave=2, fingerprint="fp"))
    refs = [BatchId(1, 0, i) for i in range((1 << 20) // 8)]
    sched = Scheduler(refs, affinity=aff)
    assert len(aff._blocks) == 0  # no block looked up for any of the epoch's 131072 batches yet
    sched.lanes.lane("a:1", 4)
    orders = sched.plan(0, ["a:1"], ("a:1",), 0.0)
    assert orders.fetch["a:1"] and len(aff._blocks) < 1000
