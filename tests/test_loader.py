"""ResumableLoader: persistent workers follow set_epoch and resume, epochs advance by themselves,
and a stop at an epoch boundary resumes at batch 0 of the next epoch."""
from __future__ import annotations

import gc
import multiprocessing
import time

import pytest
import torch
from torch.utils.data import DataLoader

from data_service.contract.tensor_layout import batch_digest
from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec
from dnn_worker import DeviceFeeder, LocalDataset, ResumableLoader

OPTS = {"size": 48, "batch_size": 4, "shape": [1, 6, 6]}  # 12 batches per epoch


def dataset(**kw) -> LocalDataset:
    return LocalDataset(PipelineSpec("examples.synthetic:build_pipeline", OPTS), seed=5, **kw)


def reference(epoch: int, start: int = 0, **kw) -> list[str]:
    ds = dataset(**kw)
    ds.set_epoch(epoch)
    return [batch_digest(b) for b in ds][start:]


def worker_pids(loader: ResumableLoader) -> list[int]:
    return [w.pid for w in loader.loader._iterator._workers]


def test_persistent_workers_follow_set_epoch_and_resume(fresh_forkserver):
    loader = ResumableLoader(DataLoader(dataset(), batch_size=None, num_workers=2, persistent_workers=True,
                                        multiprocessing_context="forkserver"))
    try:
        loader.set_epoch(3)
        assert [batch_digest(b) for b in loader] == reference(3)
        pids = worker_pids(loader)
        assert loader.epoch == 4  # a finished epoch moves on by itself
        loader.set_epoch(1)
        got = []
        for batch in loader:
            got.append(batch_digest(batch))
            if len(got) == 5:
                break
        state = loader.state_dict()
        assert state["epoch"] == 1 and state["position"] == 5
        loader.load_state_dict({**state, "position": 2})  # resume elsewhere, same workers
        assert [batch_digest(b) for b in loader] == reference(1, start=2)
        assert worker_pids(loader) == pids, "persistent workers were not re-spawned"
    finally:
        loader.close()


def test_a_loop_broken_off_stops_its_workers_when_the_loop_ends(fresh_forkserver):
    # With the cyclic collector off, the iteration must end by reference counting alone, as it
    # does when a trainer breaks out of its loop (a step budget, SIGTERM) and carries on.
    loader = ResumableLoader(DataLoader(dataset(), batch_size=None, num_workers=2,
                                        multiprocessing_context="forkserver"))
    before = set(multiprocessing.active_children())
    gc.disable()
    try:
        def take_three() -> list:
            for n, _ in enumerate(loader, 1):
                if n == 3:
                    return [p for p in multiprocessing.active_children() if p not in before]
            return []

        workers = take_three()
        assert len(workers) == 2
        deadline = time.monotonic() + 3.0
        while any(p.is_alive() for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(p.is_alive() for p in workers), "the broken-off loop's loader workers still run"
        assert loader.state_dict()["position"] == 3
    finally:
        gc.enable()
        loader.close()


def test_a_stop_at_the_epoch_boundary_resumes_at_batch_0_of_the_next_epoch():
    ds = dataset(rank=1, world_size=2)
    feeder = DeviceFeeder(ResumableLoader(DataLoader(ds, batch_size=None)), "cpu", depth=4)
    assert sum(1 for _ in zip(range(6), feeder)) == 6  # all six of rank 1's batches, then stop
    state = feeder.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    again = DeviceFeeder(ResumableLoader(DataLoader(dataset(rank=1, world_size=2), batch_size=None)), "cpu")
    again.load_state_dict(state)
    again.set_epoch(again.epoch)
    assert [batch_digest(b) for b in again] == reference(1, rank=1, world_size=2)


def test_bad_resume_states_name_the_fix():
    loader = ResumableLoader(DataLoader(dataset(), batch_size=None))
    with pytest.raises(ConfigError, match="lacks.*pass what state_dict"):
        loader.load_state_dict({"epoch": 1})
    with pytest.raises(ConfigError, match="same seed"):
        loader.load_state_dict({"epoch": 0, "position": 1, "seed": 9})
    with pytest.raises(ConfigError, match="epoch=-1"):
        loader.set_epoch(-1)
    with pytest.raises(ConfigError, match="RemoteDataset/LocalDataset"):
        ResumableLoader(DataLoader(torch.utils.data.TensorDataset(torch.zeros(2))))


@pytest.mark.parametrize("position", [7, 30, -1])
def test_a_position_past_the_rank_s_share_is_refused_at_load_naming_it(position):
    # rank 1 of 2 holds 6 of the 12 batches: position 7 is another job's checkpoint
    loader = DeviceFeeder(ResumableLoader(DataLoader(dataset(rank=1, world_size=2), batch_size=None)), "cpu")
    state = {"epoch": 0, "seed": 5, "position": position, "dp_rank": 1, "dp_size": 2}
    match = (r"position=-1, not an int >= 0" if position < 0 else
             rf"position={position} of epoch 0, past this rank's share of 6 batches \(dp_rank 1 of 2, 12 batches an "
             r"epoch\).*batch_size")
    with pytest.raises(ConfigError, match=match):
        loader.load_state_dict(state)
    assert loader.state_dict()["position"] == 0  # nothing was loaded
    loader.load_state_dict(dict(state, position=6))  # its whole share trained: the next epoch
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (1, 0)


@pytest.mark.parametrize("workers, persistent", [(0, False), (1, True), (1, False)])
@pytest.mark.slow
def test_the_next_epochs_first_batches_are_fetched_ahead_and_used(server_factory, fresh_forkserver, workers,
                                                                  persistent):
    from _fault_helpers import wait_until
    from conftest import TOKEN
    from dnn_worker import RemoteDataset

    server = server_factory(OPTS, num_workers=1)
    ds = RemoteDataset([server.address], TOKEN, seed=5, epochs=3, lookahead=2)
    loader = ResumableLoader(DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=persistent,
                                        multiprocessing_context="forkserver" if workers else None))
    try:
        conns = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            assert [batch_digest(b) for b in loader] == reference(epoch)
            if workers == 0:
                conns.append(ds.fetcher.servers[0].conn)
        if workers == 0:  # one data-plane connection across epochs
            assert conns[0] is conns[1] is not None
        # every batch built once; the lookahead of epoch 1 was used, that of epoch 2 waits.
        # A loader worker that ends with its epoch fetches nothing ahead.
        expected = 24 + (2 if workers == 0 or persistent else 0)
        wait_until(lambda: server.stats.snapshot().batches_sent >= expected, 10, f"{expected} batches sent")
        assert server.stats.snapshot().batches_sent == expected
        loader.set_epoch(2)
        assert [batch_digest(b) for b in loader] == reference(2)  # the last epoch: nothing fetched ahead
        if workers == 0:
            assert ds.fetcher.servers[0].conn is None and conns[0].closed, "the last epoch closes its connections"
        expected += 12 - (2 if workers == 0 or persistent else 0)
        wait_until(lambda: server.stats.snapshot().batches_sent >= expected, 10, f"{expected} batches sent")
        assert server.stats.snapshot().batches_sent == expected
        loader.load_state_dict({"epoch": 1, "position": 3, "seed": 5})
        assert [batch_digest(b) for b in loader] == reference(1, start=3)
    finally:
        loader.close()


def test_a_plain_epoch_loop_keeps_its_connections_between_epochs_and_closes_them_once_it_stops(
        server_factory, monkeypatch):
    """No ``epochs`` given: each epoch's connections wait for the next epoch's iteration (which
    then starts without reconnecting) for ``KEEP_OPEN_S``, then close, so the server sees the job gone."""
    from _fault_helpers import wait_until
    from conftest import TOKEN
    from dnn_worker import RemoteDataset
    from dnn_worker import remote_dataset

    monkeypatch.setattr(remote_dataset, "KEEP_OPEN_S", 1.0)
    server = server_factory(OPTS, num_workers=1)
    ds = RemoteDataset([server.address], TOKEN, seed=5)
    conns = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert [batch_digest(b) for b in ds] == reference(epoch)
        conns.append(ds.fetcher.servers[0].conn)
    assert conns[0] is conns[1] is not None and not conns[0].closed  # one connection for both epochs
    assert server.stats.snapshot().seconds_since_last_consumer < 0  # still connected
    wait_until(lambda: conns[0].closed, 10, "the connection closed once the loop stopped")
    wait_until(lambda: server.stats.snapshot().seconds_since_last_consumer >= 0, 10, "the server sees the job gone")
    ds.set_epoch(2)  # a later epoch connects again
    assert [batch_digest(b) for b in ds] == reference(2)


def test_a_dataset_iterated_once_and_let_go_closes_its_connections_at_once(server_factory, monkeypatch):
    from _fault_helpers import wait_until
    from conftest import TOKEN
    from dnn_worker import RemoteDataset
    from dnn_worker import remote_dataset

    monkeypatch.setattr(remote_dataset, "KEEP_OPEN_S", 300.0)  # the linger's end is not what closes them
    server = server_factory(OPTS, num_workers=1)
    assert [batch_digest(b) for b in RemoteDataset([server.address], TOKEN, seed=5)] == reference(0)
    wait_until(lambda: server.stats.snapshot().seconds_since_last_consumer >= 0, 10, "the server sees the job gone")
