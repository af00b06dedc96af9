"""The consumer state contract: the outermost stage's state_dict() is exact for any composition.

For {RemoteDataset, LocalDataset} x {0, 2 loader workers, persistent or not} x {DeviceFeeder
depth 1, 2, 4} x {1, 2 ranks}: stop after any k batches of a two-epoch run (or kill -9 the
process with a checkpoint every N steps), resume in a fresh process, and the audit log of both
runs together is the uninterrupted run's, batch for batch (sha256).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, TOKEN
from data_service.contract.pipeline import PipelineSpec
from dnn_worker import ControlClient, LocalDataset

import _consumer_scenario as scenario

EPOCHS = 2
FAST = settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
THOROUGH = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


class Zygote:
    """Forks fresh scenario processes (tests/_consumer_scenario.py) on request."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "_consumer_scenario.py")], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"})

    def run(self, job: dict) -> int:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the scenario zygote died (rc={self.proc.poll()})")
        return json.loads(line)["rc"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def env():
    from data_service.server import DataServer, ServerOptions

    server = DataServer(PipelineSpec(scenario.PIPELINE, scenario.OPTS), TOKEN, ServerOptions(num_workers=1)).start()
    with ControlClient(server.address, TOKEN, "contract-test") as ctl:
        hello = ctl.hello(timeout=5.0).SerializeToString().hex()
    zygote = Zygote()
    yield {"server": server.address, "hello": hello, "zygote": zygote}
    zygote.close()
    server.shutdown(grace_s=1.0)


_reference: dict[tuple[int, int], list[tuple[int, int, str]]] = {}


def reference(rank: int, world: int) -> list[tuple[int, int, str]]:
    """The uninterrupted run's (epoch, batch, sha256) for this rank (LocalDataset is bit-identical)."""
    if (rank, world) not in _reference:
        from data_service.contract.tensor_layout import batch_digest

        ds = LocalDataset(PipelineSpec(scenario.PIPELINE, scenario.OPTS), seed=3, rank=rank, world_size=world)
        out = []
        for epoch in range(EPOCHS):
            ds.set_epoch(epoch)
            out += [(epoch, index, batch_digest(b)) for index, b in zip(ds.rank_indices(), ds)]
        _reference[(rank, world)] = out
    return _reference[(rank, world)]


def audit(path: Path) -> list[tuple[int, int, str]]:
    if not path.exists():
        return []
    return [(e["epoch"], e["batch"], e["sha256"]) for e in map(json.loads, path.read_text().splitlines())]


compositions = st.fixed_dictionaries({
    "kind": st.sampled_from(["local", "remote"]),
    "workers": st.sampled_from([0, 2]),
    "persistent": st.booleans(),
    "depth": st.sampled_from([1, 2, 4]),
    "world": st.sampled_from([1, 2]),
    "rank_pick": st.integers(0, 1),
})


def make_job(env, tmp: Path, comp: dict) -> dict:
    job = {k: v for k, v in comp.items() if k != "rank_pick"}
    job.update(rank=comp["rank_pick"] % comp["world"], seed=3, epochs=EPOCHS, server=env["server"],
               hello=env["hello"], audit=str(tmp / "audit.jsonl"), ckpt=str(tmp / "ckpt.json"),
               log=str(tmp / "log.txt"))
    return job


def describe(job: dict) -> str:
    return ", ".join(f"{k}={job[k]}" for k in ("kind", "workers", "persistent", "depth", "world", "rank"))


def check_stop_and_resume(env, tmp: Path, comp: dict, frac: float) -> None:
    job = make_job(env, tmp, comp)
    ref = reference(job["rank"], job["world"])
    k = round(frac * len(ref))  # any k of any epoch, both ends and the epoch boundary included
    assert env["zygote"].run({**job, "stop_after": k}) == 0, Path(job["log"]).read_text()
    first = audit(tmp / "audit.jsonl")
    assert first == ref[:k], f"{describe(job)}: the stopped run trained {len(first)} batches, expected {k}"
    assert env["zygote"].run(job) == 0, Path(job["log"]).read_text()
    both = audit(tmp / "audit.jsonl")
    resumed = both[len(first):]
    assert both == ref, (f"{describe(job)}, stop after {k}: resumed with {resumed[:3]}..., expected {ref[k:k + 3]}... "
                         f"(skipped {len(ref) - len(both)} batch(es) if positive)")


def check_kill_and_resume(env, tmp: Path, comp: dict, frac: float, every: int) -> None:
    job = make_job(env, tmp, comp)
    ref = reference(job["rank"], job["world"])
    k = max(1, round(frac * len(ref)))
    rc = env["zygote"].run({**job, "stop_after": k, "every": every, "kill": True})
    assert rc == -9, (rc, Path(job["log"]).read_text())
    killed = audit(tmp / "audit.jsonl")
    saved = json.loads((tmp / "ckpt.json").read_text())["steps"] if (tmp / "ckpt.json").exists() else 0
    assert saved == k // every * every and len(killed) == k
    assert env["zygote"].run({**job, "every": every}) == 0, Path(job["log"]).read_text()
    resumed = audit(tmp / "audit.jsonl")[len(killed):]
    # nothing after the checkpoint lost, nothing before it repeated
    assert killed[:saved] + resumed == ref, (f"{describe(job)}, kill -9 after {k}, checkpoint at {saved}: resumed with "
                                             f"{resumed[:3]}..., expected {ref[saved:saved + 3]}...")


@FAST
@given(comp=compositions, frac=st.floats(0, 1))
@pytest.mark.slow
def test_stop_after_any_batch_and_resume_in_a_fresh_process(env, tmp_path_factory, comp, frac):
    check_stop_and_resume(env, tmp_path_factory.mktemp("run"), comp, frac)


@FAST
@given(comp=compositions, frac=st.floats(0, 1), every=st.integers(1, 7))
def test_kill_9_with_periodic_checkpoints_loses_and_repeats_nothing(env, tmp_path_factory, comp, frac, every):
    check_kill_and_resume(env, tmp_path_factory.mktemp("kill"), comp, frac, every)


@pytest.mark.slow
@THOROUGH
@given(comp=compositions, frac=st.floats(0, 1), every=st.integers(1, 7), kill=st.booleans())
def test_contract_thoroughly(env, tmp_path_factory, comp, frac, every, kill):
    if kill:
        check_kill_and_resume(env, tmp_path_factory.mktemp("kill"), comp, frac, every)
    else:
        check_stop_and_resume(env, tmp_path_factory.mktemp("run"), comp, frac)
