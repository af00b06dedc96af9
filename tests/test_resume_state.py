"""The consumer's resume state: one typed value, a plain dict at the edges, older checkpoints still read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data_service.contract.pipeline import PipelineSpec
from data_service.errors import ConfigError
from dnn_worker import LocalDataset
from dnn_worker.resume.resharding import deal, merge_states
from dnn_worker.resume.state import VERSION, EarlierWorld, Remainder, ResumeState
from launcher.train import checkpoint

DATA = Path(__file__).parent / "data"


def _kept_checkpoint(tmp_path):
    """A launcher checkpoint written by the consumer before its state was versioned: 4 ranks mid-epoch."""
    (tmp_path / checkpoint.FILE_NAME).write_bytes((DATA / "checkpoint-format1.pt").read_bytes())
    return checkpoint.load(str(tmp_path)), json.loads((DATA / "checkpoint-format1.expected.json").read_text())


def test_a_checkpoint_written_before_versions_resumes_the_same_batches(tmp_path):
    ckpt, expected = _kept_checkpoint(tmp_path)
    assert all("version" not in s for s in ckpt["data"])
    spec = PipelineSpec(ckpt["pipeline"], ckpt["pipeline_options"])
    for rank in range(4):
        ds = LocalDataset(spec, seed=ckpt["seed"], rank=rank, world_size=4)
        ds.load_state_dict(ckpt["data"][rank])
        assert list(ds.rank_indices()) == expected["same_world"][rank]
    for rank in range(3):  # every old rank's state, dealt to 3
        ds = LocalDataset(spec, seed=ckpt["seed"], rank=rank, world_size=3)
        ds.load_state_dict(ckpt["data"])
        assert list(ds.rank_indices()) == expected["dealt_to_3"][rank]
    ds = LocalDataset(spec, seed=ckpt["seed"], rank=1, world_size=3)
    ds.load_state_dict(ckpt["dealt_rank1_of_3"])  # a dealt rank's own state, one batch in
    assert list(ds.rank_indices()) == expected["dealt_rank1_of_3"]
    again = ds.state_dict()
    assert again["version"] == VERSION and ResumeState.from_dict(again) == ResumeState.from_dict(ckpt["dealt_rank1_of_3"])


def test_state_dict_is_plain_data_that_torch_loads_with_weights_only(tmp_path):
    spec = PipelineSpec("examples.synthetic:build_pipeline", {"size": 48, "batch_size": 4, "shape": [1, 4, 4]})
    states = []
    for rank in range(4):
        ds = LocalDataset(spec, seed=3, rank=rank, world_size=4)
        it = iter(ds)
        for _ in range(rank):
            next(it)
        states.append(ds.state_dict())
    dealt = deal(states, 3)
    path = tmp_path / "s.pt"
    torch.save({"states": states, "dealt": dealt, "merged": merge_states(states)}, path)
    back = torch.load(path, weights_only=True)
    assert back["states"] == states and back["dealt"] == dealt
    assert [ResumeState.from_dict(s) for s in back["dealt"]] == [ResumeState.from_dict(s) for s in dealt]


def test_a_finished_rank_reads_as_none_whether_written_as_minus_one_or_none():
    old = {"epoch": 2, "seed": 1, "position": 0,
           "earlier_worlds": [{"dp_size": 2, "positions": [-1, 3], "remainder": "pad"}]}
    parsed = ResumeState.from_dict(old)
    assert parsed.earlier_worlds == (EarlierWorld(2, (None, 3), Remainder.PAD),)
    assert ResumeState.from_dict(parsed.to_dict()) == parsed


@pytest.mark.parametrize("state, words", [
    ({"epoch": 0}, "lacks ['position']"),
    ({"epoch": -1, "position": 0}, "epoch=-1"),
    ({"epoch": 0, "position": 1.5}, "position=1.5"),
    ({"epoch": 0, "position": 0, "dp_rank": 3, "dp_size": 2}, "dp_rank=3"),
    ({"epoch": 0, "position": 0, "version": VERSION + 1}, f"version={VERSION + 1}"),
    ({"epoch": 0, "position": 0, "earlier_worlds": [{"dp_size": 2, "positions": [1]}]}, "lists 1 positions"),
    ({"epoch": 0, "position": 0, "earlier_worlds": [{"dp_size": 1, "positions": [1], "remainder": "x"}]},
     "remainder='x'"),
    ("epoch 0", "is not a dict"),
])
def test_a_bad_state_is_named_once_where_it_enters(state, words):
    with pytest.raises(ConfigError, match=None) as err:
        ResumeState.from_dict(state)
    assert words in str(err.value)


_world = st.integers(1, 5).flatmap(lambda n: st.builds(
    EarlierWorld, st.just(n), st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=n, max_size=n).map(tuple),
    st.sampled_from(list(Remainder))))
_state = st.integers(1, 6).flatmap(lambda size: st.builds(
    ResumeState, epoch=st.integers(0, 100), position=st.integers(0, 10 ** 6),
    seed=st.one_of(st.none(), st.integers(0, 2 ** 31)), dp_rank=st.integers(0, size - 1), dp_size=st.just(size),
    earlier_worlds=st.lists(_world, max_size=3).map(tuple)))


@settings(max_examples=200, deadline=None)
@given(_state)
def test_to_dict_and_back_is_the_same_state_and_survives_json(state):
    as_dict = state.to_dict()
    assert ResumeState.from_dict(as_dict) == state
    assert ResumeState.from_dict(json.loads(json.dumps(as_dict))) == state
