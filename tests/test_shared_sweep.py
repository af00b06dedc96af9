"""Jobs of a sweep reading one data server with a batch window: each batch built once while the
window holds it, every job's epoch exact (bit-identical to its own in-process run), a job behind
the window served by building its batches again, jobs of other seeds never given another's batch."""
from __future__ import annotations

import importlib.util
import json
import threading
import time

import pytest

from conftest import TOKEN, start_server
from data_service.contract.tensor_layout import batch_digest
from data_service.server.stats import WindowFigures
from dnn_worker import RemoteDataset
from hetero.testing.audit import Reference

PIPELINE = "examples.synthetic:build_pipeline"
OPTIONS = {"size": 120, "batch_size": 8}  # 15 batches of 8 x 1x8x8 uint8 (about 0.8 KB each on the wire)


def job(address: str, seed: int, epoch: int = 0, step_s: float = 0.0, shm: bool = False) -> list[str]:
    """One job's epoch: the digest of each batch, in order."""
    ds = RemoteDataset([address], TOKEN, seed=seed, shared_memory=shm, batch_timeout=30)
    ds.set_epoch(epoch)
    out = []
    for batch in ds:
        out.append(batch_digest(batch))
        if step_s:
            time.sleep(step_s)
    return out


def run_jobs(address: str, specs: list[dict]) -> list[list[str]]:
    results: list = [None] * len(specs)
    errors: list = []

    def run(k: int) -> None:
        try:
            results[k] = job(address, **specs[k])
        except BaseException as exc:  # reported below, with the job that raised it
            errors.append((k, exc))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


def figures(server) -> dict[str, float]:
    """The window's counters (none without a window) and the batches built."""
    snap = server.stats.snapshot()
    window = WindowFigures.of(snap)
    return {**(window.to_json() if window is not None else {}), "batches_built": float(snap.batches_built)}


def change(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


@pytest.fixture(scope="module")
def window_server():
    """One server with a 1 MB batch window (every batch of the plan fits) for the tests below."""
    server = start_server(OPTIONS, batch_window_bytes=1 << 20, probe=False)
    yield server
    server.shutdown(grace_s=2.0)


def test_jobs_of_one_seed_get_each_batch_built_once_and_every_epoch_exact(window_server, capsys):
    before = figures(window_server)
    got = run_jobs(window_server.address, [{"seed": 7, "shm": True}, {"seed": 7}, {"seed": 7, "step_s": 0.002}])
    expected = Reference(PIPELINE, OPTIONS, 7).digests(0)
    assert all(g == expected for g in got)
    f = change(before, figures(window_server))
    # every batch of the epoch built once; and, with the epoch's last asked for, the next epoch's first
    # built ahead by idle workers (nobody asks for them here)
    assert f["misses"] == len(expected) and f["batches_built"] == len(expected) + f["built_ahead"]
    assert 0 < f["built_ahead"] <= 4 and f["ahead_used"] == 0
    assert f["hits"] + f["joined"] == 2 * len(expected)
    assert f["built_again"] == 0
    now = figures(window_server)
    assert 0 < now["held_bytes"] <= now["budget_bytes"]
    from hetero.cli import main as hetero_main

    assert hetero_main(["stats", window_server.address, "--token", TOKEN]) == 0
    shown = json.loads(capsys.readouterr().out)["window"]
    assert {"hits", "heldBytes", "builtAgain"} <= set(shown)


def test_a_job_behind_the_window_gets_its_batches_built_again_exactly(server_factory):
    budget = 4000  # about four batches
    compression = "lz4" if importlib.util.find_spec("lz4") else ""  # the window keeps batches as sent
    server = server_factory(OPTIONS, batch_window_bytes=budget, probe=False, compression=compression)
    expected = Reference(PIPELINE, OPTIONS, 3).digests(0)
    assert job(server.address, seed=3) == expected  # the leader: every batch built once
    assert job(server.address, seed=3, shm=True) == expected  # far behind: the window slid past it
    f = figures(server)
    # what the window still held when the job first asked (its last few batches) was sent from there
    held = int(f["batches"])
    assert f["built_again"] + f["hits"] == len(expected) and f["hits"] <= held
    assert server.stats.snapshot().batches_built == len(expected) + f["built_again"] + f["built_ahead"]
    assert 0 < f["held_bytes"] <= budget and f["evicted"] > 0


def test_jobs_of_other_seeds_never_get_each_others_batches(window_server):
    server = window_server
    before = figures(server)
    got = run_jobs(server.address, [{"seed": 1}, {"seed": 2, "shm": True}, {"seed": 1, "epoch": 1}])
    assert got[0] == Reference(PIPELINE, OPTIONS, 1).digests(0)
    assert got[1] == Reference(PIPELINE, OPTIONS, 2).digests(0)
    assert got[2] == Reference(PIPELINE, OPTIONS, 1).digests(1)
    assert len({*got[0]} & {*got[1]}) == 0
    f = change(before, figures(server))
    # nothing is shared across seeds or epochs: only epoch 1's first batches, if seed 1's epoch 0
    # ended first and idle workers built them ahead, are the third job's hits
    shared = f["hits"] + f["joined"]
    assert shared == f["ahead_used"] and f["misses"] == 3 * len(got[0]) - shared


def test_a_pipeline_figure_named_like_a_window_counter_leaves_the_windows_counters_alone(server_factory):
    server = server_factory(OPTIONS, batch_window_bytes=1 << 20, probe=False, num_workers=1)
    server.stats.pipeline_stats = lambda: {"window_hits": 1e9, "hits": 1e9}  # the pipeline's own figures
    expected = Reference(PIPELINE, OPTIONS, 3).digests(0)
    assert job(server.address, seed=3) == expected
    snap = server.stats.snapshot()
    assert snap.pipeline["window_hits"] == snap.pipeline["hits"] == 1e9
    window = WindowFigures.of(snap)
    assert window is not None and window.hits == 0 and window.misses == len(expected)


def test_without_a_window_each_job_gets_its_own_builds(server_factory):
    server = server_factory(OPTIONS, probe=False, num_workers=1)
    got = run_jobs(server.address, [{"seed": 5}, {"seed": 5}])
    assert got[0] == got[1] == Reference(PIPELINE, OPTIONS, 5).digests(0)
    assert server.stats.snapshot().batches_built == 2 * len(got[0])
    assert "hits" not in figures(server)


@pytest.mark.slow
def test_a_data_node_killed_under_a_shared_sweep_leaves_every_job_exact(tmp_path):
    """Three jobs of one seed on two data nodes with batch windows; one node is killed -9 mid-epoch
    (its window and the builds it owed gone) and comes back at the same address: each job's
    audit holds both epochs exactly once, bit-identical to its own in-process run."""
    from hetero.testing import ServerProc, check_audit

    nodes = [ServerProc(OPTIONS, token=TOKEN, batch_window="1MB", log_path=tmp_path / f"node{k}.log")
             for k in range(2)]
    killed = threading.Event()
    try:
        for node in nodes:
            node.start(wait=False)
        for node in nodes:
            node.wait_ready()
        addresses = [n.address for n in nodes]
        errors: list = []

        def job(k: int) -> None:
            try:
                ds = RemoteDataset(addresses, TOKEN, seed=11, audit_path=str(tmp_path / f"job{k}.jsonl"),
                                   connect_timeout=60, batch_timeout=30)
                for epoch in range(2):
                    ds.set_epoch(epoch)
                    for n, _ in enumerate(ds):
                        if k == 0 and epoch == 0 and n == 5 and not killed.is_set():
                            nodes[0].kill()  # kill -9 of the node's process group, requests outstanding
                            killed.set()
                            nodes[0].start(wait=False)  # same ports: the jobs use it again once up
                        time.sleep(0.01 * (k + 1))
            except BaseException as exc:  # reported by the main thread
                errors.append((k, exc))

        threads = [threading.Thread(target=job, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert killed.is_set() and not errors, errors
        for k in range(3):
            acc = check_audit(tmp_path / f"job{k}.jsonl", OPTIONS, seed=11)
            assert (acc["delivered"], acc["lost"], acc["duplicated"], acc["corrupt"], acc["foreign"]) == \
                (2 * 15, 0, 0, 0, 0), acc
    finally:
        for node in nodes:
            node.kill()


def test_a_job_resumed_on_another_rank_count_beside_another_job_trains_its_epoch_once(window_server):
    """Job B trains 3 steps on 2 ranks, then resumes its epoch on 1 rank, while job A (same seed)
    reads the whole epoch from the same window: B's batches are its epoch exactly once, and both
    jobs' bytes are their in-process run's."""
    from torch.utils.data import DataLoader

    from dnn_worker import ResumableLoader

    expected = Reference(PIPELINE, OPTIONS, 21).digests(0)
    got_a: list[str] = []
    other = threading.Thread(target=lambda: got_a.extend(job(window_server.address, seed=21, step_s=0.01)))
    other.start()

    def loader(rank: int, world: int) -> ResumableLoader:
        ds = RemoteDataset([window_server.address], TOKEN, seed=21, rank=rank, world_size=world, shared_memory=False)
        return ResumableLoader(DataLoader(ds, batch_size=None))

    trained: list[tuple[int, str]] = []
    first = [loader(r, 2) for r in range(2)]
    iters = [iter(ld) for ld in first]
    for _ in range(3):  # lockstep, as DDP steps
        for ld, it in zip(first, iters):
            trained.append(_step(ld, it))
    states = [ld.state_dict() for ld in first]
    for it in iters:
        it.close()
    second = loader(0, 1)
    second.load_state_dict(states)  # both old ranks' states: the rest of the epoch is dealt to one rank
    for batch in second:
        trained.append((second.last_yielded.index, batch_digest(batch)))
    other.join(120)
    assert sorted(i for i, _ in trained) == list(range(len(expected)))
    assert all(expected[i] == d for i, d in trained)
    assert got_a == expected


def _step(ld, it) -> tuple[int, str]:
    batch = next(it)
    return ld.last_yielded.index, batch_digest(batch)
