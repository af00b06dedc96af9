import numpy as np
import pytest

from data_service.errors import ConfigError
from data_service.contract.sampler import EpochShape, _permutation, batch_indices, derive_seed, rank_share


def test_num_batches_drop_or_keep_last():
    assert EpochShape(100, 8, drop_last=False).num_batches == 13
    assert EpochShape(100, 8, drop_last=True).num_batches == 12
    assert EpochShape(96, 8, drop_last=False).num_batches == 12


def test_epoch_covers_every_sample_once_and_last_batch_is_partial():
    cfg = EpochShape(100, 8)
    seen = [i for b in range(cfg.num_batches) for i in batch_indices(cfg, 7, 3, b)]
    assert sorted(seen) == list(range(100))
    assert len(batch_indices(cfg, 7, 3, 12)) == 4


def test_permutation_depends_on_seed_and_epoch_only():
    cfg = EpochShape(1000, 10)
    assert batch_indices(cfg, 1, 0, 5) == batch_indices(EpochShape(1000, 10), 1, 0, 5)
    assert batch_indices(cfg, 1, 0, 5) != batch_indices(cfg, 1, 1, 5)
    assert batch_indices(cfg, 1, 0, 5) != batch_indices(cfg, 2, 0, 5)
    assert batch_indices(EpochShape(10, 5, shuffle=False), 1, 0, 1) == [5, 6, 7, 8, 9]


def test_unshuffled_plans_draw_and_cache_nothing_whatever_the_seed():
    # Consumers with many seeds (one per job, or per iterator in benchmarks.scale) must not
    # evict each other's cached permutations: an unshuffled plan has none to draw.
    _permutation.cache_clear()
    cfg = EpochShape(1_000_000, 64, shuffle=False)
    for seed in range(10):
        assert batch_indices(cfg, seed, seed % 3, 3) == list(range(192, 256))
    assert batch_indices(EpochShape(10, 4, shuffle=False), 1, 0, 2) == [8, 9]
    assert _permutation.cache_info().currsize == 0
    # A shuffled plan keeps its per-(seed, epoch) permutation: the same batches as ever.
    shuffled = EpochShape(10, 4)
    expected = np.random.Generator(np.random.PCG64(derive_seed(5, 2, 0xE90C))).permutation(10)
    assert batch_indices(shuffled, 5, 2, 1) == expected[4:8].tolist()
    assert _permutation.cache_info().currsize == 1


def test_out_of_range_batches_are_index_errors():
    cfg = EpochShape(10, 5)
    with pytest.raises(IndexError, match="0..1"):
        batch_indices(cfg, 0, 0, 2)
    with pytest.raises(IndexError):
        batch_indices(cfg, 0, -1, 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_samples=0, batch_size=1), "empty"),
    (dict(num_samples=10, batch_size=0), "batch_size"),
    (dict(num_samples=3, batch_size=4, drop_last=True), "no batch"),
])
def test_bad_plans_name_the_value(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EpochShape(**kwargs)


def test_derived_seeds_are_stable_and_distinct():
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert len({derive_seed(1, e, i) for e in range(10) for i in range(100)}) == 1000


@pytest.mark.parametrize("batches, world", [(13, 1), (13, 2), (13, 4), (12, 3), (5, 5)])
def test_rank_shares_are_equal_disjoint_and_interleaved(batches, world):
    shares = [rank_share(batches, r, world, "drop") for r in range(world)]
    assert len({len(s) for s in shares}) == 1
    flat = [i for s in shares for i in s]
    assert len(flat) == len(set(flat)) == batches // world * world
    assert all(s[k] == k * world + r for r, s in enumerate(shares) for k in range(len(s)))


def test_pad_gives_every_rank_ceil_batches():
    shares = [rank_share(13, r, 4, "pad") for r in range(4)]
    assert [len(s) for s in shares] == [4, 4, 4, 4]
    assert set(i for s in shares for i in s) == set(range(13))


def test_share_errors():
    with pytest.raises(ConfigError, match="too short"):
        rank_share(3, 0, 4, "drop")
    with pytest.raises(ConfigError, match="rank=4"):
        rank_share(10, 4, 4)
    with pytest.raises(ConfigError, match="remainder"):
        rank_share(10, 0, 2, "spread-ish")
