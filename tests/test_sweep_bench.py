"""python -m benchmarks.sweep: each job's audit accounting, and one short run end to end (slow tier)."""
from __future__ import annotations

import json

import pytest

from benchmarks.common.sweep_jobs import JobRecord, audit


def write_audit(path, rows) -> None:
    path.write_text("".join(json.dumps({"epoch": e, "batch": b, "rank": 0, "sha256": d}) + "\n" for e, b, d in rows))


def reference(options, seed, epoch, index) -> str:
    return f"{seed}/{epoch}/{index}"


def test_the_audit_counts_wrong_skipped_and_duplicated_batches(tmp_path):
    path = tmp_path / "a.jsonl"
    record = JobRecord("job0", 3, 0.0, str(path))
    good = [(0, b, f"3/0/{b}") for b in range(4)] + [(1, b, f"3/1/{b}") for b in range(2)]
    write_audit(path, good)
    assert audit(record, {}, reference, per_epoch=4) == {"delivered": 6, "wrong": 0, "skipped": 0, "duplicated": 0}
    bad = [(0, 0, "3/0/0"), (0, 2, "3/0/2"), (0, 2, "3/0/2"), (0, 3, "another job's"), (1, 0, "3/1/0")]
    write_audit(path, bad)
    # batch 1 of epoch 0 never came (skipped), batch 2 came twice, batch 3 has other bytes
    assert audit(record, {}, reference, per_epoch=4) == {"delivered": 5, "wrong": 1, "skipped": 1, "duplicated": 1}
    write_audit(path, [(0, 0, "3/0/0"), (1, 0, "3/1/0")])  # epoch 0 left unfinished before epoch 1 began
    assert audit(record, {}, reference, per_epoch=4)["skipped"] == 3


def test_a_job_records_its_step_and_data_wait_within_the_measured_span():
    record = JobRecord("job0", 1, 0.01, "unused")
    record.arrivals = [(0.0, 0.5), (1.0, 0.1), (2.0, 0.3), (3.0, 0.2), (9.0, 1.0)]
    figures = record.figures(0.5, 3.5)
    assert figures["batches"] == 3 and figures["step_ms"] == pytest.approx(1000.0)
    assert figures["wait_ms"] == pytest.approx(200.0)


@pytest.mark.slow
@pytest.mark.timeout(900)  # five data servers start, on two cores shared with the rest of the suite
def test_a_short_run_prints_both_layouts_and_every_audit_clean(tmp_path, capsys):
    from benchmarks.sweep import main

    out = tmp_path / "sweep.json"
    assert main(["--images-dir", str(tmp_path / "photos"), "--images", "128", "--seconds", "3",
                 "--calibrate-seconds", "2", "--cases", "equal,own-seeds", "--window-batches", "8",
                 "--without-build-ahead", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "### equal" in text and "### own-seeds" in text and "Shared with build-ahead against shared without" in text
    figures = json.loads(out.read_text())
    for case in figures["cases"].values():
        for runs in case["runs"].values():
            for audit_row in runs[-1]["audits"]:
                assert audit_row["delivered"] > 0
                assert (audit_row["wrong"], audit_row["skipped"], audit_row["duplicated"]) == (0, 0, 0)
            assert runs[-1]["window_max_bytes"] <= runs[-1]["window_budget"] or not runs[-1]["window_budget"]


def test_a_cpu_split_puts_the_node_under_its_quota_and_the_jobs_beside_it():
    import os
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks.common.cpu_split import CpuSplit

    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: nothing to split")
    before = Path("/proc/self/cgroup").read_text()
    split = CpuSplit(cores - 0.5)
    if not split.available:
        split.close()
        pytest.skip("no writable cgroup v1 cpu hierarchy here (root is needed)")
    try:
        with split.node():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert "-node" in Path(f"/proc/{child.pid}/cgroup").read_text()
            assert "-jobs" in Path("/proc/self/cgroup").read_text()
            assert (split._node / "cpu.cfs_quota_us").read_text().strip() == str(int((cores - 0.5) * 100_000))
            assert (split._jobs / "cpu.cfs_quota_us").read_text().strip() == "50000"
        finally:
            child.kill()
            child.wait(10)
    finally:
        split.close()
    assert Path("/proc/self/cgroup").read_text() == before
    assert not split._node.exists() and not split._jobs.exists()
