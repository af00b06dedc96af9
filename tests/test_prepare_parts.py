"""hetero prepare on several machines: --part i/N writes disjoint shards, --merge joins them into the
index a single run writes; a run that stops mid-way and starts again keeps the shards it finished."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from data_service.errors import ConfigError
from data_service.shards import ShardDataset
from data_service.shards.format import INDEX_NAME
from data_service.shards.indexfile import read_index, verify
from data_service.prepare.writer import merge_parts, prepare
from data_service.prepare.plan import PLAN, WORK, parse_part

SOURCE = "tests._noise_source:make"
OPTIONS = {"n": 60, "side": 256}  # noise JPEGs of about 60 KB: 4 shards of about 1 MB


def _run(dest: Path, **kw):
    return prepare(SOURCE, str(dest), shard_size=1_000_000, workers=1, progress=False, options=OPTIONS, **kw)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("single") / "out"
    summary = _run(dest)
    assert summary.samples == 60 and summary.shards == 4
    return dest


def _assert_same_prefix(a: Path, b: Path) -> None:
    x, y = read_index(str(a)), read_index(str(b))
    assert list(x.shards) == list(y.shards) and x.classes == y.classes and x.id == y.id
    for col in ("offsets", "lengths", "labels"):
        assert np.array_equal(getattr(x, col), getattr(y, col))
    for s in x.shards:
        assert (a / s.name).read_bytes() == (b / s.name).read_bytes(), s.name
    da, db = ShardDataset(str(a)), ShardDataset(str(b))
    assert [da[i] for i in range(len(da))] == [db[i] for i in range(len(db))]
    assert not (b / WORK).exists()  # the run's manifests are gone once the index is written
    verify(str(b / INDEX_NAME))


def test_two_parts_merged_give_the_index_and_shards_of_a_single_run(single, tmp_path):
    dest = tmp_path / "parts"
    first = _run(dest, part="0/2")
    assert first.part == "0/2" and first.shards == 2 and not (dest / INDEX_NAME).exists()
    with pytest.raises(ConfigError, match="2 of 4 shard.*not written yet.*shard-000002.tar"):
        merge_parts(str(dest))
    second = _run(dest, part=(1, 2))
    assert second.shards == 2 and first.samples + second.samples == 60
    names = lambda: {p.name for p in dest.glob("*.tar")}  # noqa: E731
    assert names() == {f"shard-00000{k}.tar" for k in range(4)}  # disjoint: each part wrote its own two
    merged = merge_parts(str(dest))
    assert merged.samples == 60 and merged.shards == 4
    _assert_same_prefix(single, dest)


def test_a_part_with_other_options_is_refused(tmp_path):
    dest = tmp_path / "out"
    _run(dest, part="0/2")
    with pytest.raises(ConfigError, match="unfinished prepare run with other options.*--overwrite"):
        _run(dest, part="1/2", shuffle_seed=5)
    assert (dest / PLAN).exists()


def test_a_run_that_stopped_mid_way_keeps_its_finished_shards_and_ends_as_a_single_run(single, tmp_path,
                                                                                         monkeypatch):
    dest = tmp_path / "resumed"
    monkeypatch.setenv("HETERO_TEST_FAIL_AT", "50")  # item 50 lies in the fourth shard of the shuffled order
    with pytest.raises(RuntimeError, match="the machine stops here"):
        _run(dest, shuffle_seed=None)
    done = sorted(p.name for p in (dest / WORK).glob("shard-*.json"))
    assert done == [f"shard-00000{k}.tar.json" for k in range(3)] and not (dest / INDEX_NAME).exists()
    stamps = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.glob("*.tar")}
    monkeypatch.delenv("HETERO_TEST_FAIL_AT")
    summary = _run(dest, shuffle_seed=None)
    assert summary.kept == 3 and summary.samples == 60
    for name, stamp in stamps.items():  # kept, not written again
        assert ((dest / name).stat().st_ino, (dest / name).stat().st_mtime_ns) == stamp, name
    again = tmp_path / "clean"
    _run(again, shuffle_seed=None)
    _assert_same_prefix(again, dest)


def test_hetero_prepare_cli_parts_and_merge(tmp_path, capsys):
    from hetero.cli import main

    dest = str(tmp_path / "cli")
    common = ["--shard-size", "1MB", "--workers", "1", "--quiet", "-o", "n=20", "-o", "side=256"]
    assert main(["prepare", SOURCE, dest, "--part", "1/2", *common]) == 0
    assert "hetero prepare --merge" in "".join(capsys.readouterr())
    assert main(["prepare", "--merge", dest]) == 2  # part 0 is missing
    assert "not written yet" in "".join(capsys.readouterr())
    assert main(["prepare", SOURCE, dest, "--part", "0/2", *common]) == 0
    assert main(["prepare", "--merge", dest]) == 0
    assert len(read_index(dest)) == 20
    assert main(["prepare", SOURCE, dest, "--part", "2/2", *common]) == 2
    assert "0 <= i < N" in "".join(capsys.readouterr())


@pytest.mark.parametrize("text", ["1", "2/2", "-1/3", "a/b", "1/0"])
def test_bad_parts_are_named(text):
    with pytest.raises(ConfigError, match="--part"):
        parse_part(text)
