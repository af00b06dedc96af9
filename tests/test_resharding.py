"""An epoch resumed on another number of data-parallel ranks: the untrained batches dealt again,
each exactly once, equal counts per rank, the same bytes; errors that name the state and the fix."""
from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings, strategies as st
from torch.utils.data import DataLoader

from data_service.contract.pipeline import PipelineSpec
from data_service.contract.sampler import rank_share
from data_service.contract.tensor_layout import batch_digest
from data_service.errors import ConfigError
from dnn_worker import DeviceFeeder, LocalDataset, ResumableLoader
from data_service.contract.batch_id import BatchId
from dnn_worker.resume.batch_list import BatchList, rank_stride
from dnn_worker.resume.resharding import deal, dealt_share, merge_states, remaining
from dnn_worker.resume.state import VERSION

OPTS = {"size": 100, "batch_size": 4, "shape": [1, 4, 4]}  # 25 batches per epoch
SPEC = PipelineSpec("examples.synthetic:build_pipeline", OPTS)


def dataset(rank: int, world: int, **kw) -> LocalDataset:
    return LocalDataset(SPEC, seed=3, rank=rank, world_size=world, **kw)


def reference(epoch: int) -> list[str]:
    ds = dataset(0, 1)
    ds.set_epoch(epoch)
    return [batch_digest(b) for b in ds]


def train(loaders, steps: int) -> dict[int, list[tuple[int, str]]]:
    """``steps`` lockstep steps on every rank's loader (as DDP would): rank -> (batch, digest)."""
    out: dict[int, list[tuple[int, str]]] = collections.defaultdict(list)
    iters = [iter(ld) for ld in loaders]
    for _ in range(steps):
        for r, (ld, it) in enumerate(zip(loaders, iters)):
            batch = next(it)
            out[r].append((ld.last_yielded.index, batch_digest(batch)))
    for it in iters:
        it.close()
    return out


def loaders(world: int, remainder: str = "drop"):
    return [ResumableLoader(DataLoader(dataset(r, world, remainder=remainder), batch_size=None))
            for r in range(world)]


@pytest.mark.parametrize("old,new", [(4, 2), (2, 3), (3, 1), (2, 4)])
def test_the_rest_of_the_epoch_trains_once_on_another_rank_count(old, new):
    first = loaders(old)
    before = train(first, 3)
    states = [ld.state_dict() for ld in first]
    second = loaders(new)
    for ld in second:
        ld.load_state_dict(states)  # every old rank's state: the rest is dealt to this world
    per = len(second[0])
    assert all(len(ld) == per for ld in second)  # equal counts: DDP never waits on a short rank
    after = train(second, per)
    trained = [b for r in before.values() for b in r] + [b for r in after.values() for b in r]
    indices = [b for b, _ in trained]
    assert len(indices) == len(set(indices)), "no batch twice"
    left_out = (25 - 3 * old) % new  # remainder="drop": the last few of the rest
    assert set(range(25)) - set(indices) == set(range(25 - left_out, 25))
    ref = reference(0)
    assert all(sha == ref[b] for b, sha in trained)  # the same bytes whichever rank trains them
    # the next epoch is shared among the new ranks as usual
    assert all(ld.state_dict() == {"version": VERSION, "epoch": 1, "seed": 3, "position": 0, "dp_rank": r, "dp_size": new}
               for r, ld in enumerate(second))
    nxt = train(second, 25 // new)
    assert {r: [b for b, _ in v] for r, v in nxt.items()} == {r: rank_share(25, r, new) for r in range(new)}


def test_a_state_of_another_rank_count_alone_is_refused_with_the_fix():
    ds = dataset(0, 2)
    with pytest.raises(ConfigError, match=r"dp_size=4, this job has dp_size=2; pass every rank's state"):
        ds.load_state_dict({"epoch": 0, "seed": 3, "position": 2, "dp_rank": 0, "dp_size": 4})


@pytest.mark.parametrize("states,match", [
    ([{"epoch": 0, "seed": 3, "position": 2, "dp_rank": 0, "dp_size": 2}], r"must hold dp_rank 0..1, got dp_rank\(s\) \[0\]"),
    ([{"epoch": 0, "seed": 3, "position": 2, "dp_rank": 0, "dp_size": 2},
      {"epoch": 0, "seed": 4, "position": 2, "dp_rank": 1, "dp_size": 2}], r"rank 1's state has seed=4"),
    ([{"epoch": 0, "seed": 3, "position": 2, "dp_rank": 0, "dp_size": 2},
      {"epoch": 2, "seed": 3, "position": 0, "dp_rank": 1, "dp_size": 2}], r"at most one finished share apart"),
    ([{"epoch": 0, "seed": 3, "position": 2, "dp_rank": 0, "dp_size": 2},
      {"epoch": 0, "seed": 3, "position": 2, "dp_rank": 1, "dp_size": 3}], r"dp_size=2 and dp_size=3 mixed"),
    ([{"epoch": 0, "seed": 3, "dp_rank": 0, "dp_size": 1}], r"lacks \['position'\]"),
    ({"epoch": 0, "seed": 3, "position": 2, "dp_rank": 0, "dp_size": 1}, r"takes a list of every old rank's state"),
])
def test_bad_states_are_named(states, match):
    with pytest.raises(ConfigError, match=match):
        merge_states(states)


def test_a_position_beyond_the_share_names_rank_and_share():
    point = merge_states([{"epoch": 0, "seed": 3, "position": 30, "dp_rank": 0, "dp_size": 1}])
    with pytest.raises(ConfigError, match=r"rank 0 of 1 is at position=30, outside its share of 0..25"):
        dealt_share(25, point["earlier_worlds"], 0, 2)


def test_a_position_beyond_an_earlier_rank_s_share_is_refused_at_load():
    ld = loaders(3)[0]
    with pytest.raises(ConfigError, match=r"rank 1 of 2 is at position=13, outside its share of 0..12 batches"):
        ld.load_state_dict([{"epoch": 0, "seed": 3, "position": p, "dp_rank": r, "dp_size": 2}
                            for r, p in enumerate([12, 13])])
    assert "earlier_worlds" not in ld.state_dict()  # nothing was loaded


def test_a_rank_that_finished_its_share_counts_as_having_trained_all_of_it():
    states = [{"epoch": 1, "seed": 0, "position": 0, "dp_rank": 0, "dp_size": 2},
              {"epoch": 0, "seed": 0, "position": 10, "dp_rank": 1, "dp_size": 2}]
    point = merge_states(states)
    assert point["earlier_worlds"][0]["positions"] == [None, 10]
    rest = list(remaining(25, point["earlier_worlds"]))  # rank 0 trained 0,2,..,22; rank 1 1,3,..,19
    assert rest == [21, 23, 24]


def test_resumed_twice_in_one_epoch_and_through_every_stage():
    first = loaders(4)
    before = train(first, 2)  # batches 0..7
    second = loaders(2)
    for ld in second:
        ld.load_state_dict([ld0.state_dict() for ld0 in first])
    middle = train(second, 3)
    states = [ld.state_dict() for ld in second]
    assert all(len(s["earlier_worlds"]) == 1 for s in states)
    feeders = [DeviceFeeder(ResumableLoader(DataLoader(dataset(r, 3), batch_size=None))) for r in range(3)]
    for f in feeders:
        f.load_state_dict(states)  # the outermost stage passes the list on
    after = train(feeders, len(feeders[0]))
    got = [b for part in (before, middle, after) for r in part.values() for b, _ in r]
    assert len(got) == len(set(got)) and len(got) == 8 + 6 + (25 - 14) // 3 * 3


@pytest.mark.slow
def test_persistent_workers_restart_to_see_the_deal(fresh_forkserver):
    ld = ResumableLoader(DataLoader(dataset(0, 2), batch_size=None, num_workers=2, persistent_workers=True,
                                    multiprocessing_context="forkserver"))
    try:
        next(iter(ld))  # workers started with the plain share
        ld.load_state_dict([{"epoch": 0, "seed": 3, "position": 5, "dp_rank": r, "dp_size": 3} for r in range(3)])
        got = []
        for _ in ld:
            got.append(ld.last_yielded.index)
        assert got == list(dealt_share(25, [{"dp_size": 3, "positions": [5, 5, 5]}], 0, 2))
    finally:
        ld.close()


@pytest.mark.slow
def test_persistent_workers_restart_when_set_epoch_leaves_a_dealt_epoch(fresh_forkserver):
    # a rank of 3 resumed from a 4-rank checkpoint trains the dealt rest of epoch 0, then epoch 0
    # again from its start: its workers must drop the deal they were started with
    ld = ResumableLoader(DataLoader(dataset(0, 3), batch_size=None, num_workers=2, persistent_workers=True,
                                    multiprocessing_context="forkserver"))
    try:
        ld.load_state_dict([{"epoch": 0, "seed": 3, "position": 2, "dp_rank": r, "dp_size": 4} for r in range(4)])
        ref = reference(0)
        dealt = [(ld.last_yielded.index, batch_digest(b)) for b in ld]
        assert dealt == [(i, ref[i]) for i in (8, 11, 14, 17, 20)]
        ld.set_epoch(0)
        again = [(ld.last_yielded.index, batch_digest(b)) for b in ld]
        assert again == [(i, ref[i]) for i in rank_stride(25, 0, 3, "drop")]  # the batches the audit names
        assert ld.state_dict() == {"version": VERSION, "epoch": 1, "seed": 3, "position": 0, "dp_rank": 0, "dp_size": 3}
    finally:
        ld.close()


def test_a_dealt_share_answers_positions_by_arithmetic():
    share = dealt_share(1000, [{"dp_size": 3, "positions": [7, 6, 7]}], 1, 4)
    values = list(share)
    assert all(share.index(v) == j for j, v in enumerate(values)) and 10**6 not in share
    lst = BatchList(0, [(0, share[2:])])
    assert lst.index_of(BatchId(0, 0, values[5])) == 3 and lst.unique()
    assert list(share[1::2]) == values[1::2]


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 200), old=st.integers(1, 9), new=st.integers(1, 9), data=st.data(),
       remainder=st.sampled_from(["drop", "pad"]), lockstep=st.booleans())
def test_deal_property_every_untrained_batch_once_equal_counts(n, old, new, data, remainder, lockstep):
    full = n // old if remainder == "drop" else -(-n // old)
    if lockstep:
        positions = [data.draw(st.integers(0, full))] * old
    else:
        positions = data.draw(st.lists(st.integers(0, full), min_size=old, max_size=old))
    trained = {(k * old + r) % n for r, p in enumerate(positions) for k in range(p)}
    states = [{"epoch": 0, "seed": 1, "position": p, "dp_rank": r, "dp_size": old} for r, p in enumerate(positions)]
    point = merge_states(states, remainder)
    shares = [list(dealt_share(n, point["earlier_worlds"], r, new, remainder)) for r in range(new)]
    rest = [b for b in range(n) if b not in trained]
    assert list(remaining(n, point["earlier_worlds"])) == rest  # in epoch order
    assert len({len(s) for s in shares}) == 1  # equal counts
    dealt = [b for s in shares for b in s]
    assert set(dealt) <= set(rest)  # nothing trained twice
    if remainder == "drop":
        assert len(dealt) == len(set(dealt)) == len(rest) - len(rest) % new  # once each, the last few dropped
        assert set(rest) - set(dealt) == set(rest[len(rest) - len(rest) % new:])
    else:
        assert set(dealt) == set(rest)  # every untrained batch; pad repeats the first few
    assert deal(states, new, remainder)[new - 1]["dp_rank"] == new - 1


def test_an_epoch_of_millions_of_batches_deals_by_arithmetic():
    positions = [1000] * 64
    share = dealt_share(4_000_000, [{"dp_size": 64, "positions": positions}], 5, 48)
    assert isinstance(share.base, range) and share[0] == 64_000 + 5 and len(share) == (4_000_000 - 64_000) // 48


def test_the_same_world_resumed_from_a_list_trains_what_its_own_state_would():
    first = loaders(2)
    train(first, 4)
    states = [ld.state_dict() for ld in first]
    a, b = loaders(2), loaders(2)
    for ld, s in zip(a, states):
        ld.load_state_dict(s)
    for ld in b:
        ld.load_state_dict(states)
    assert train(a, len(a[0])) == train(b, len(b[0]))
