"""torchrun restarts a job with another world size: the rest of the epoch is dealt to the new
ranks, every batch trains once (audited), with a data node killed -9 during the resumed part."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import reshard_drill
from hetero.testing import ServerProc
from hetero.testing.processes import PIPELINE


@pytest.fixture
def two_data_nodes():
    servers = [ServerProc(reshard_drill.OPTIONS, pipeline=PIPELINE, workers=1).start() for _ in range(2)]
    yield servers
    for s in servers:
        s.stop()


@pytest.mark.slow  # five interpreters importing torch at once: kept away from the default tier's timed tests
def test_2_ranks_then_3_with_a_data_node_killed_train_every_batch_once(tmp_path: Path, two_data_nodes):
    row = reshard_drill.run_case(2, 3, True, tmp_path / "case", two_data_nodes)
    assert row["killed"], row
    assert row["lost"] == row["duplicated"] == row["corrupt"] == 0, row
    assert row["before"] == 2 * 4 and row["per_new_rank"] == [(60 - 8) // 3], row  # equal counts per rank
    assert row["left_out"] == row["allowed_left_out"] == (60 - 8) % 3, row
    assert reshard_drill.verdict([row])

