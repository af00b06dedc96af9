"""Integration: real servers on free ports, real worker processes, real consumers."""
from __future__ import annotations

import os
import time

import grpc
import pytest
import torch
from torch.utils.data import DataLoader

from _fault_helpers import next_event
from conftest import TOKEN
from data_service.contract.batch_id import BatchId
from data_service.contract.tensor_layout import batch_digest
from data_service.errors import (BatchBuildError, ConfigError, PermissionDeniedError, ServerUnavailableError,
                                 VersionMismatchError)
from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions
from data_service.protocol.generated import pb
from data_service.protocol.version import PROTOCOL_VERSION
from dnn_worker import ControlClient, LocalDataset, RemoteDataset
from dnn_worker.transport.connection import BulkConnection
from dnn_worker.fetch.fetch_options import FetchOptions
from dnn_worker.fetch.fetcher import Fetcher

SPEC = PipelineSpec("examples.synthetic:build_pipeline", {"size": 100, "batch_size": 8})


def digests(dataset, epoch=0, num_workers=0):
    dataset.set_epoch(epoch)
    if num_workers:
        dataset = DataLoader(dataset, batch_size=None, num_workers=num_workers, multiprocessing_context="spawn")
    return [batch_digest(b) for b in dataset]


@pytest.mark.parametrize("shm", [True, False], ids=["shared-memory", "tcp"])
def test_remote_batches_are_bit_identical_to_in_process(shared_server, shm):
    remote = digests(RemoteDataset([shared_server.address], TOKEN, seed=5, shared_memory=shm), epoch=2)
    local = digests(LocalDataset(SPEC, seed=5), epoch=2)
    assert len(remote) == 13  # epoch ends by itself: 100 samples / 8, last kept
    assert remote == local
    assert len(set(remote)) == 13  # each batch exactly once
    assert remote != digests(LocalDataset(SPEC, seed=5), epoch=3)


@pytest.mark.parametrize("shm", [True, False], ids=["shared-memory", "tcp"])
@pytest.mark.slow
def test_loader_workers_take_disjoint_parts_in_order(shared_server, shm):
    single = digests(RemoteDataset([shared_server.address], TOKEN, seed=1, shared_memory=shm), epoch=0)
    multi = digests(RemoteDataset([shared_server.address], TOKEN, seed=1, shared_memory=shm), epoch=0, num_workers=2)
    assert multi == single


@pytest.mark.parametrize("shm", [True, False], ids=["shared-memory", "tcp"])
def test_an_ended_epoch_leaves_no_connection_thread_running(shared_server, shm):
    # A receiving thread still dropping a tensor while the interpreter exits is killed inside
    # torch's destructor and the process aborts ("terminate called without an active
    # exception", 8 of 150 consumer runs before closing waited for the threads).
    import threading

    def ours():
        return [t.name for t in threading.enumerate() if t.name.startswith(("recv-", "release-"))]

    assert ours() == []
    for _ in range(3):
        assert len(digests(RemoteDataset([shared_server.address], TOKEN, seed=5, shared_memory=shm))) == 13
        assert ours() == []


def test_batches_are_tensors_with_their_shapes(shared_server):
    batch = next(iter(RemoteDataset([shared_server.address], TOKEN, seed=0)))
    assert batch["image"].shape == (8, 1, 8, 8) and batch["image"].dtype == torch.uint8
    assert batch["label"].dtype == torch.int64


def test_stats_and_health(shared_server):
    list(RemoteDataset([shared_server.address], TOKEN, seed=9))
    with ControlClient(shared_server.address, TOKEN) as ctl:
        assert ctl.healthy()
        stats = ctl.stats()
    assert stats.batches_sent >= 13 and stats.bytes_sent > 13 * 8 * 64
    assert stats.batches_built >= stats.batches_sent
    assert stats.workers == 2 and 0 < stats.worker_busy_fraction <= 1
    assert stats.queue_depth == 0 and stats.consumer_ever_connected


def test_wrong_token_is_denied_and_server_keeps_serving(shared_server):
    with ControlClient(shared_server.address, "wrong") as ctl:
        with pytest.raises(PermissionDeniedError):
            ctl.hello()
        with pytest.raises(PermissionDeniedError):
            ctl.shutdown()
        with pytest.raises(PermissionDeniedError):
            ctl.stats()
    with ControlClient(shared_server.address, TOKEN) as ctl:
        port = ctl.hello().bulk_port
    conn = BulkConnection(shared_server.address, "127.0.0.1", port, "wrong")
    with pytest.raises(PermissionDeniedError, match="data plane"):
        conn.open()
    assert len(list(RemoteDataset([shared_server.address], TOKEN))) == 13
    with ControlClient(shared_server.address, TOKEN) as ctl:
        assert ctl.stats().auth_failures >= 4


def test_version_mismatch_names_both_versions(shared_server, monkeypatch):
    from data_service.protocol import version as protocol

    with ControlClient(shared_server.address, TOKEN) as ctl:
        port = ctl.hello().bulk_port
    monkeypatch.setattr(protocol, "PROTOCOL_VERSION", "2.0")  # what the consumer announces (the server keeps its own)
    with ControlClient(shared_server.address, TOKEN) as ctl:
        with pytest.raises(VersionMismatchError, match=rf"'2.0'.*'{PROTOCOL_VERSION}'"):
            ctl.hello()
    conn = BulkConnection(shared_server.address, "127.0.0.1", port, TOKEN)
    with pytest.raises(VersionMismatchError, match=rf"'2.0'.*'{PROTOCOL_VERSION}'"):
        conn.open()


def test_out_of_range_request_is_an_error_not_a_hang(shared_server):
    refs = [BatchId(0, 0, 13)]
    with pytest.raises(Exception, match="outside the plan"):
        list(Fetcher([shared_server.address], refs, FetchOptions(TOKEN, connect_timeout=5)))


def test_requests_go_out_half_a_window_at_a_time(shared_server, monkeypatch):
    # One FetchRequest per half window, not one per batch: fewer frames for the server to read.
    frames: list[int] = []
    real = BulkConnection.fetch
    monkeypatch.setattr(BulkConnection, "fetch", lambda self, refs: frames.append(len(refs)) or real(self, refs))
    refs = [BatchId(0, 0, i) for i in range(12)]
    assert [r.index for r, _ in Fetcher([shared_server.address], refs, FetchOptions(TOKEN, window=4))] == list(range(12))
    assert frames[0] == 4 and sum(frames) == 12, frames
    assert all(n >= 2 for n in frames[:-1]), f"requests of one batch: {frames}"


@pytest.mark.parametrize("small", [True, False], ids=["small-batches", "large-batches"])
def test_the_window_widens_for_small_batches_only(shared_server, monkeypatch, small):
    # Batches of at most SMALL_BATCH_BYTES cost per batch: the window grows to small_window.
    # Larger ones keep the window (memory: window x batch size per server).
    import dnn_worker.fetch.scheduler as scheduler_mod

    if not small:
        monkeypatch.setattr(scheduler_mod, "SMALL_BATCH_BYTES", 0)
    refs = [BatchId(0, 0, i) for i in range(12)]
    fetcher = Fetcher([shared_server.address], refs, FetchOptions(TOKEN, window=4, small_window=8))
    assert [r.index for r, _ in fetcher] == list(range(12))
    assert fetcher.windows() == {shared_server.address: 8 if small else 4}
    ds = RemoteDataset([shared_server.address], TOKEN)
    list(ds)
    assert ds.fetcher.windows() == {shared_server.address: 8 if small else 4}, \
        "RemoteDataset's default window must widen for small batches"
    ds = RemoteDataset([shared_server.address], TOKEN, window=3)
    list(ds)
    assert ds.fetcher.windows() == {shared_server.address: 3}, "a window the user gave must stay as given"


@pytest.mark.parametrize("shm", [True, False], ids=["shared-memory", "tcp"])
def test_client_disconnect_mid_stream_loses_nothing(server_factory, shm):
    shared_server = server_factory()  # its own: no other test's consumer connected
    with ControlClient(shared_server.address, TOKEN) as ctl:
        port = ctl.hello().bulk_port
    conn = BulkConnection(shared_server.address, "127.0.0.1", port, TOKEN, shared_memory=shm)
    conn.open()
    conn.fetch([BatchId(4, 0, i) for i in range(13)])
    got = [next_event(conn, 30) for _ in range(2)]
    assert all(e.kind == "batch" for e in got)
    conn.close()
    deadline = time.monotonic() + 10
    with ControlClient(shared_server.address, TOKEN) as ctl:
        while time.monotonic() < deadline:
            s = ctl.stats()
            if s.active_streams == 0 and s.slots_in_use == 0 and s.queue_depth == 0:
                break
            time.sleep(0.05)
        assert (s.active_streams, s.slots_in_use, s.queue_depth) == (0, 0, 0)
    # The next consumer gets the whole epoch, the undelivered batches included.
    assert digests(RemoteDataset([shared_server.address], TOKEN, seed=4)) == digests(LocalDataset(SPEC, seed=4))


def test_transform_error_names_epoch_batch_sample_and_server_survives(server_factory):
    server = server_factory({"size": 40, "batch_size": 4, "fail_at": 17, "shuffle": False}, probe=False)
    ds = RemoteDataset([server.address], TOKEN)
    ds.set_epoch(1)
    with pytest.raises(BatchBuildError) as info:
        list(ds)
    err = info.value
    assert (err.epoch, err.index, err.sample_index) == (1, 4, 17)
    assert "ValueError: synthetic failure on sample 17" in str(err) and "Traceback" in str(err)
    refs = [BatchId(0, 1, i) for i in (0, 1, 2, 3, 5)]
    assert len(list(Fetcher([server.address], refs, FetchOptions(TOKEN)))) == 5


def test_worker_death_is_rebuilt_without_gap_or_duplicate(server_factory, tmp_path):
    opts = {"size": 60, "batch_size": 6, "shuffle": False, "crash_once_at": 33, "crash_marker": str(tmp_path / "m")}
    server = server_factory(opts, probe=False)
    remote = digests(RemoteDataset([server.address], TOKEN, seed=2))
    assert (tmp_path / "m").exists()  # a worker really died
    local = digests(LocalDataset(PipelineSpec("examples.synthetic:build_pipeline", {**opts, "crash_once_at": None}), seed=2))
    assert remote == local
    with ControlClient(server.address, TOKEN) as ctl:
        deadline = time.monotonic() + 30
        while ctl.stats().worker_restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ctl.stats().worker_restarts == 1


def test_no_server_waits_then_names_addresses_and_seconds():
    from hetero.testing import free_port

    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError) as info:
        list(RemoteDataset([address], TOKEN, connect_timeout=1.5))
    waited = time.monotonic() - start
    assert 1.5 <= waited < 10
    assert address in str(info.value) and "1.5" in str(info.value)


def test_memory_stays_bounded_with_a_slow_consumer(server_factory):
    server = server_factory({"size": 400, "batch_size": 2, "shape": [3, 64, 64]}, num_workers=2, slots_per_worker=2)
    ds = RemoteDataset([server.address], TOKEN, window=64)
    it = iter(ds)
    next(it)
    time.sleep(1.5)  # consumer stalls while 63 requests are outstanding
    with ControlClient(server.address, TOKEN) as ctl:
        s = ctl.stats()
    assert s.slots_in_use <= 4 and s.bytes_in_slots <= 4 * 2 * 3 * 64 * 64 + 4 * 64
    assert s.batches_built - s.batches_sent <= 4 + 64 // 8  # bounded, far below the 63 asked for
    assert len(list(it)) == 199


@pytest.mark.parametrize("options, server_kw, match", [
    ({"size": 10, "batch_size": 4}, {"max_batch_bytes": 100}, "exceeds max_batch_bytes=100"),
    ({"size": 10, "fail_at": 0, "shuffle": False}, {}, "fails on epoch 0, batch 0"),
])
def test_bad_start_up_is_an_error_at_start(options, server_kw, match):
    from conftest import start_server

    with pytest.raises(ConfigError, match=match):
        start_server(options, num_workers=1, **server_kw)


def test_bad_import_path_fails_before_workers_start():
    from data_service.server import DataServer

    with pytest.raises(ConfigError, match="cannot import module 'nowhere'"):
        DataServer(PipelineSpec("nowhere:build"), TOKEN).start()


def test_shutdown_needs_token_is_idempotent_and_finishes_in_flight(server_factory):
    server = server_factory({"size": 64, "batch_size": 2, "work_ms": 20}, num_workers=2)
    ds = RemoteDataset([server.address], TOKEN, window=8, connect_timeout=2)
    it = iter(ds)
    first = next(it)
    with ControlClient(server.address, TOKEN) as ctl:
        assert ctl.shutdown(grace_s=20, reason="test") is False
        assert ctl.shutdown(grace_s=20) is True
    # What was already requested is delivered; the rest is refused and the client, with no
    # other server, fails with a clear error instead of hanging.
    got = 1
    with pytest.raises(ServerUnavailableError):
        for _ in it:
            got += 1
    assert 1 + 2 <= got < 32 and first is not None
    assert server.wait(30)
    with pytest.raises((grpc.RpcError, ServerUnavailableError)):
        ControlClient(server.address, TOKEN).hello(timeout=1)


@pytest.mark.parametrize("context", ["forkserver", "spawn"])
def test_dataset_with_cached_hello_pickles_into_loader_workers(shared_server, context):
    ds = RemoteDataset([shared_server.address], TOKEN, seed=1)
    assert len(ds) == 13  # a Hello in this process, cached
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    assert [batch_digest(b) for b in loader] == digests(LocalDataset(SPEC, seed=1))


def test_worker_nice_lowers_the_workers_priority_and_bad_values_are_refused():
    # A server on cores a trainer also uses (dnn_local_server, a homogeneous node) builds in the
    # cycles the trainer leaves: its workers run at a higher nice value than the server.
    server = DataServer(SPEC, TOKEN, ServerOptions(num_workers=1, probe=False, worker_nice=7)).start()
    try:
        [pid] = server.pool.worker_pids()
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)
    finally:
        server.shutdown(grace_s=1)
    for bad in (-1, 20, True):
        with pytest.raises(ConfigError, match="worker_nice"):
            ServerOptions(worker_nice=bad)
