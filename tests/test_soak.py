"""A short soak in the default run: random faults over many epochs, then nothing lost or duplicated.

The long run is ``python -m benchmarks.soak --batches 100000 --max-seconds 600`` (docs/faults.md).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # the fault suite injects each fault by default; python -m benchmarks.soak runs them at random
@pytest.mark.timeout(240)
def test_short_soak_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "benchmarks.soak", "--batches", "3000", "--max-seconds", "45", "--servers", "3",
           "--fault-gap", "1.5", "3", "--workdir", str(tmp_path / "work"), "--json", str(out), "--seed", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert out.is_file(), proc.stdout + proc.stderr
    r = json.loads(out.read_text())
    detail = proc.stdout + "\n" + proc.stderr[-3000:]
    assert r["delivered"] >= 300, detail
    assert (r["lost"], r["duplicated"], r["corrupt"], r["foreign"]) == (0, 0, 0, 0), detail
    assert r["consumer_failures"] == 0 and r["server_failures"] == 0, detail
    assert r["faults_total"] >= 3, detail
    # Bounded memory (README, docs/consumer.md): a server holds at most workers x slots_per_worker
    # built batches in its workers' slots, plus, per consumer connection, at most the consumer's
    # default window, max(8, 2 x workers), of batches moved aside while that consumer is not reading
    # them (so the others go on). 2 alone counts only the workers' slots and fails on the first
    # batch moved aside. max_slots_in_use is the most any one server held; each consumer rank has
    # one connection to each server.
    workers, connections = r["workers_per_server"], r["consumers"]
    bound = workers * r["slots_per_worker"] + connections * max(8, 2 * workers)
    assert r["max_slots_in_use"] <= bound, (r["max_slots_in_use"], bound, detail)
    assert proc.returncode == 0, detail
    for label, e in r["rss_mib"].items():  # memory flat: no process grew by more than 100 MiB
        if e["start_max_mib"] and e["end_max_mib"]:
            assert e["end_max_mib"] - e["start_max_mib"] < 100, (label, e)
