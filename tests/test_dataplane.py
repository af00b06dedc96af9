"""Shared memory on one host, compression, and the choice between them."""
from __future__ import annotations

import os
import queue
import time

import pytest

from conftest import TOKEN
from data_service.contract.tensor_layout import batch_digest
from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec
from data_service.server import ServerOptions
from dnn_worker import ControlClient, LocalDataset, RemoteDataset
from dnn_worker.transport.connection import BulkConnection

OPTS = {"size": 60, "batch_size": 6, "shape": [3, 32, 32]}


def reference(seed=0):
    return [batch_digest(b) for b in LocalDataset(PipelineSpec("examples.synthetic:build_pipeline", OPTS), seed=seed)]


def shm_files() -> set[str]:
    """Named shared memory in /dev/shm, less multiprocessing's semaphores (another test's DataLoader
    beside this one under xdist: the suite's own check at the end counts those)."""
    names = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    return {n for n in names if not n.startswith("sem.")}


def test_same_host_consumer_gets_shared_memory_automatically(server_factory):
    server = server_factory(OPTS, num_workers=1)
    with ControlClient(server.address, TOKEN) as ctl:
        port = ctl.hello().bulk_port
    local = BulkConnection(server.address, "127.0.0.1", port, TOKEN)
    forced_tcp = BulkConnection(server.address, "127.0.0.1", port, TOKEN, shared_memory=False)
    local.open()
    forced_tcp.open()
    assert local.shm and not forced_tcp.shm
    local.close()
    forced_tcp.close()


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
@pytest.mark.parametrize("shm", [True, False], ids=["shared-memory", "tcp"])
@pytest.mark.slow
def test_compressed_batches_are_bit_identical_and_counted(server_factory, compression, shm):
    server = server_factory(OPTS, num_workers=1, compression=compression)
    got = [batch_digest(b) for b in RemoteDataset([server.address], TOKEN, shared_memory=shm)]
    assert got == reference()
    stats = server.stats.snapshot()
    assert stats.raw_bytes > 0 and stats.compress_s > 0


def test_compression_ratio_shows_in_stats(server_factory):
    from data_service.contract.pipeline import PipelineSpec as Spec
    from data_service.server import DataServer

    server = DataServer(Spec("examples.synthetic:build_blob_pipeline", {"size": 8, "batch_bytes": 1 << 20}), TOKEN,
                        ServerOptions(num_workers=1, compression="lz4")).start()
    try:
        batches = list(RemoteDataset([server.address], TOKEN, shared_memory=False))
        assert len(batches) == 8 and batches[0]["blob"].numel() == 1 << 20
        stats = server.stats.snapshot()
        assert stats.bytes_sent * 20 < stats.raw_bytes  # a repeating ramp compresses > 20x
    finally:
        server.shutdown(grace_s=1)


def test_unknown_compression_names_the_choices():
    with pytest.raises(ConfigError, match="must be one of"):
        ServerOptions(compression="snappy")


@pytest.mark.slow
def test_shared_memory_leaves_nothing_in_dev_shm_even_after_kill(server_process):
    before = shm_files()
    server = server_process({"size": 60, "batch_size": 6, "shape": [3, 32, 32]}).start()
    ds = RemoteDataset([server.address], TOKEN, connect_timeout=3)
    it = iter(ds)
    next(it)
    server.kill()  # kill -9 the server (and its workers) while a consumer maps its slots
    with pytest.raises(Exception):
        list(it)
    assert shm_files() - before == set()


# ----------------------------------------------------------------- zero-copy leases

def test_zero_copy_batches_are_bit_identical_and_leased(server_factory):
    server = server_factory(OPTS, num_workers=1, slots_per_worker=4)
    got = [batch_digest(b) for b in RemoteDataset([server.address], TOKEN)]
    assert got == reference()
    stats = server.stats.snapshot()
    assert stats.shm_leases > 0, "same-host batches should be handed over zero-copy"


def test_batches_held_zero_copy_are_never_overwritten_and_never_stall(server_factory):
    # One worker with two slots: at most one can be leased, so a consumer that keeps every
    # batch still gets the rest (copied) instead of waiting forever for a slot.
    server = server_factory(OPTS, num_workers=1, slots_per_worker=2)
    first = RemoteDataset([server.address], TOKEN, batch_timeout=20)
    kept = list(first)
    first.close()  # its connection ends (else it would wait KEEP_OPEN_S for a next epoch)
    assert server.stats.snapshot().shm_leases >= 1
    again = [batch_digest(b) for b in RemoteDataset([server.address], TOKEN, seed=3, batch_timeout=20)]
    assert again == reference(seed=3)
    # The first epoch's batches, some of them still views of slots whose connection ended,
    # were not rewritten by the second epoch.
    assert [batch_digest(b) for b in kept] == reference()
    assert server.stats.snapshot().slots_retired >= 1


def test_a_batch_asked_for_again_while_its_first_copy_is_kept_frees_only_the_copy_given_back(server_factory):
    # One connection for both epochs (kept open between them): the first epoch's batches are all
    # kept, zero-copy views among them; the same epoch again is dropped batch by batch. Each Release
    # names its slot, so the server frees the second copies, never a slot the first copies still
    # view: those keep their bytes, and the second pass never runs out of slots.
    server = server_factory(OPTS, num_workers=1, slots_per_worker=4)
    ds = RemoteDataset([server.address], TOKEN, batch_timeout=20)
    kept = list(ds)
    conn = ds.fetcher.servers[0].conn
    assert server.stats.snapshot().shm_leases >= 1
    ds.set_epoch(0)
    again = [batch_digest(b) for b in ds]
    assert ds.fetcher.servers[0].conn is conn and ds.fetcher.failovers == 0  # no stall dropped the server
    assert again == reference()
    assert [batch_digest(b) for b in kept] == reference()


def test_a_graceful_shutdown_does_not_wait_for_batches_a_consumer_keeps(server_factory):
    # The consumer's connection stays open (kept for a next epoch) and it holds every batch, some
    # zero-copy: nothing is left to build or send, so the shutdown waits for nothing (not for its
    # grace), and the kept batches keep their bytes after the server is gone.
    server = server_factory(OPTS, num_workers=1, slots_per_worker=4)
    ds = RemoteDataset([server.address], TOKEN)
    kept = list(ds)
    assert server.stats.snapshot().shm_leases >= 1 and not ds.fetcher.servers[0].conn.closed
    start = time.monotonic()
    server.shutdown(grace_s=300)
    assert server.stopped and time.monotonic() - start < 150, "the shutdown waited for the consumer's kept batches"
    assert [batch_digest(b) for b in kept] == reference()


def test_zero_copy_batches_can_be_changed_in_place(server_factory):
    server = server_factory(OPTS, num_workers=1, slots_per_worker=4)
    for batch in RemoteDataset([server.address], TOKEN):
        batch["image"].add_(1)  # as a training script may; the slot is the consumer's until dropped
    assert [batch_digest(b) for b in RemoteDataset([server.address], TOKEN)] == reference()
    assert server.stats.snapshot().shm_leases > 0


def test_consumer_that_vanishes_holding_leases_does_not_corrupt_the_next(server_factory):
    server = server_factory(OPTS, num_workers=1, slots_per_worker=3)
    it = iter(RemoteDataset([server.address], TOKEN))
    held = [next(it), next(it), next(it)]
    it.close()  # ends the connection while the consumer still maps the leased slots
    deadline = time.monotonic() + 10
    while server.stats.snapshot().slots_retired == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.stats.snapshot().slots_retired >= 1
    assert [batch_digest(b) for b in RemoteDataset([server.address], TOKEN)] == reference()
    assert [batch_digest(b) for b in held] == reference()[:3]


@pytest.mark.slow
def test_loader_workers_copy_out_of_leased_slots(server_factory):
    import torch

    server = server_factory(OPTS, num_workers=1, slots_per_worker=4)
    # spawn, not forkserver: a forkserver started here would keep this test's environment for
    # every later test's loader workers.
    loader = torch.utils.data.DataLoader(RemoteDataset([server.address], TOKEN), batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn")
    got = sorted(batch_digest(b) for b in loader)
    assert got == sorted(reference())


def test_a_slot_is_released_or_retired_once_whichever_comes_first():
    # A send that fails after the batch was recorded as held used to release the slot and then,
    # when the session closed, retire it too: the retire then took the slot from under a new batch.
    from data_service.contract.batch_id import BatchId
    from data_service.pool.worker_pool import Result, Task

    calls = []
    r = Result(Task(BatchId(0, 0, 0), lambda _: None), _release=lambda: calls.append("release"),
               _retire=lambda: calls.append("retire"))
    r.release()
    r.retire()
    r.release()
    assert calls == ["release"]
    r2 = Result(Task(BatchId(0, 0, 1), lambda _: None), _release=lambda: calls.append("release2"),
                _retire=lambda: calls.append("retire2"))
    r2.retire()
    r2.release()
    assert calls == ["release", "retire2"]


def test_no_slot_is_handed_out_while_it_still_holds_a_batch(monkeypatch):
    # Submit and release hand tasks to workers on the caller's thread, beside the dispatcher.
    # Between "the worker says done" and "its slot is in use" no other thread may see the slot
    # free, or the worker rebuilds into it while the batch is being read. A slow header parse
    # widens that window; each batch is read 5 ms after delivery and checked byte for byte.
    import threading

    from _fault_helpers import slow_header_parse
    from conftest import encode
    from data_service.contract.batch_id import BatchId
    from data_service.pool import worker_pool as workers
    from data_service.contract.pipeline import build_batch

    slow_header_parse(monkeypatch, lambda header: 0.003)
    spec = PipelineSpec("examples.synthetic:build_pipeline", {"size": 64, "batch_size": 4})
    pipe, n = spec.load(), 16
    cfg = pipe.epoch_shape()
    expected = {i: bytes(encode(build_batch(pipe, cfg, 0, 0, i))[2]) for i in range(n)}
    pool = workers.WorkerPool(spec.to_json(), 1, slots_per_worker=2)
    pool.start()
    results: queue.Queue = queue.Queue()
    bad: list[int] = []

    def check() -> None:
        for _ in range(3 * n):
            r = results.get(timeout=30)
            time.sleep(0.005)
            if r.error is not None or bytes(r.payload) != expected[r.task.batch.index]:
                bad.append(r.task.batch.index)
            r.release()

    checker = threading.Thread(target=check, daemon=True)
    checker.start()
    try:
        for i in list(range(n)) * 3:  # more tasks than slots: submits arrive while slots turn over
            pool.submit(workers.Task(BatchId(0, 0, i), results.put))
            time.sleep(0.001)
        checker.join(60)
        assert not checker.is_alive(), "the pool stopped delivering"
        assert bad == [], f"batches {bad} changed while they were read"
    finally:
        pool.stop()
