"""python -m benchmarks.epoch_start: one short run end to end."""
from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_a_short_run_reports_both_ways_and_every_epoch(tmp_path, capsys):
    from benchmarks import epoch_start

    out = tmp_path / "figures.json"
    assert epoch_start.main(["--images-dir", str(tmp_path / "photos"), "--images", "64", "--epochs", "2",
                             "--step-s", "0.001", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| kept |" in text and "| made again |" in text and "An epoch's first batch:" in text
    figures = json.loads(out.read_text())["figures"]
    assert {way: len(f["epoch"]) for way, f in figures.items()} == {"kept": 2, "made again": 2}
    assert all(len(f["later"]) == 2 * 1 for f in figures.values())  # 2 batches an epoch: 1 after the first
