"""Retries that end: a batch failing on every attempt ends the iteration with an error naming it,
the servers tried and the checksums seen; ``connect_timeout`` and ``batch_timeout`` bound what
their docstrings say (docs/consumer.md, "Deadlines and retries")."""
from __future__ import annotations

import time

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.common.corrupt import FlipProxy
from conftest import TOKEN
from data_service.contract.batch_id import BatchId
from data_service.errors import BatchFailedError, ConfigError, ServerUnavailableError
from data_service.protocol.generated import pb
from dnn_worker import RemoteDataset
from dnn_worker.fetch.attempts import Attempts, Failure
from dnn_worker.fetch.fetch_options import FetchOptions
from dnn_worker.fetch.scheduler import Scheduler
from hetero.testing import free_port

OPTS = {"size": 96, "batch_size": 8, "shape": [3, 32, 32]}  # 12 batches of 24 KiB

pytestmark = pytest.mark.timeout(120)


def refs(n: int) -> list[pb.BatchRef]:
    return [BatchId(1, 0, i) for i in range(n)]


# ------------------------------------------------------------------ the rules, no server

def test_a_failed_connection_counts_the_batch_to_blame_else_those_it_delivered_nothing_after():
    sched = Scheduler(refs(8))
    lane = sched.lanes.lane("a:1", window=4)
    sched.plan(0, ["a:1"], (), now=1.0)
    assert [r.index for r in lane.outstanding] == [0, 1, 2, 3]
    assert sched.charged("a:1", culprit=refs(8)[2]) == [refs(8)[2]]  # the batch whose bytes failed
    assert [r.index for r in sched.charged("a:1")] == [0, 1, 2, 3]  # nothing came after any was asked
    sched.arrived("a:1", refs(8)[0], 10, now=2.0)
    lane.asked([refs(8)[4]], now=3.0)
    # 1-3 were asked before batch 0 came: the connection made progress since; 4 was asked after
    assert [r.index for r in sched.charged("a:1")] == [4]
    assert [r.index for r in sched.charged("a:1", stalled=True)] == [1, 2, 3, 4]
    assert [r.index for r in sched.charged("a:1", culprit=refs(8)[7])] == [4]  # not owed: as if unknown
    assert sched.lost("a:1") == 4 and sched.charged("a:1") == []


def test_the_k_th_failure_of_one_batch_raises_naming_it_the_servers_and_the_checksums():
    attempts = Attempts(3)
    ref = BatchId(1, 2, 5)
    attempts.failed(ref, Failure("a:1", "x", expected=0x1234, got=0x5678))
    attempts.failed(BatchId(1, 2, 6), Failure("a:1", "other batch"))
    attempts.failed(ref, Failure("b:1", "the connection ended before it came (no batch for 5s)"))
    with pytest.raises(BatchFailedError) as info:
        attempts.failed(ref, Failure("a:1", "x", expected=0x1234, got=0x9abc))
    err = info.value
    assert (err.epoch, err.index, err.servers) == (2, 5, ["a:1", "b:1", "a:1"])
    assert err.checksums == [(0x1234, 0x5678), (0x1234, 0x9abc)]
    said = str(err)
    assert "epoch 2 batch 5 failed 3 attempts in a row (batch_attempts=3)" in said, said
    assert "expected 0x00001234 from the data worker, got 0x00005678" in said and "b:1: the connection ended" in said


@pytest.mark.parametrize("bad", [0, -1])
def test_batch_attempts_below_one_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match=f"batch_attempts={bad} must be >= 1"):
        FetchOptions("t", batch_attempts=bad)
    with pytest.raises(ConfigError, match=f"batch_attempts={bad} must be >= 1"):
        RemoteDataset(["127.0.0.1:1"], "t", batch_attempts=bad)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 20), window=st.integers(1, 6), k=st.integers(1, 4),
       connections=st.lists(st.tuples(st.integers(0, 6), st.integers(-1, 5)), min_size=1, max_size=80))
def test_retries_end_and_progress_never_ends_them(n, window, k, connections):
    """One server whose every connection delivers ``d`` batches (in the order asked), then breaks:
    between frames (``blame`` -1), or on one of the batches still owed (its bytes failed). A
    connection that delivered and blames nothing counts no attempt. Connections in a row that
    deliver nothing each count the awaited batch when nothing is blamed, one owed batch when one
    is: fewer than ``k`` of the first, at most ``window * (k - 1)`` of both in a row, then the
    iteration ends with the error of a batch that failed exactly ``k`` times."""
    sched, attempts = Scheduler(refs(n)), Attempts(k)
    lane = sched.lanes.lane("a:1", window=window)
    now, delivered, idle, unblamed = 0.0, 0, 0, 0
    for d, blame in connections:
        now += 1.0
        sched.plan(delivered, ["a:1"], (), now)
        owed = list(lane.outstanding)
        for ref in owed[:d]:
            now += 0.1
            assert sched.arrived("a:1", ref, 10, now)
            delivered += 1
        if delivered == n:
            return
        rest = owed[d:]
        culprit = rest[blame % len(rest)] if blame >= 0 and rest else None
        charged = sched.charged("a:1", culprit)
        if d and culprit is None:
            assert charged == []  # it made progress: no batch is counted
        idle, unblamed = (idle + 1, unblamed + (culprit is None)) if d == 0 else (0, 0)
        try:
            for ref in charged:
                attempts.failed(ref, Failure("a:1", "broke"))
        except BatchFailedError as err:
            assert attempts.count(BatchId(1, 0, err.index)) == k
            return
        finally:
            sched.lost("a:1")
        assert unblamed < k and idle <= window * (k - 1), (idle, unblamed, window, k)


# ------------------------------------------------------------------ real servers

@pytest.fixture
def flipping(server_factory):
    """One data server (one worker: batches leave in order) reached through a proxy that flips bytes."""
    bulk = free_port()
    proxy = FlipProxy(("127.0.0.1", bulk))
    server = server_factory(OPTS, num_workers=1, bulk_port=bulk, advertise_bulk_port=proxy.port)
    yield server, proxy
    proxy.close()


@pytest.mark.parametrize("k", [3, 2])
def test_a_batch_damaged_on_every_connection_ends_the_iteration_naming_it(flipping, k):
    # Byte 2000 of every data-plane connection, inside the first batch's payload: before, the
    # consumer reconnected for ever (110 times in 25 s), yielding nothing and raising nothing.
    server, proxy = flipping
    proxy.arm(offset=2000, mask=0x04, every=True)
    kw = {} if k == 3 else {"batch_attempts": k}
    ds = RemoteDataset([server.address], TOKEN, seed=3, shared_memory=False, connect_timeout=30, batch_timeout=20, **kw)
    start = time.monotonic()
    with pytest.raises(BatchFailedError) as info:
        list(ds)
    took = time.monotonic() - start
    err = info.value
    print(f"\nbatch_attempts={k}: {took:.2f} s: {err}")
    assert (err.epoch, err.index) == (0, 0)
    assert err.servers == [server.address] * k and proxy.flipped == k
    assert len(err.checksums) == k and all(expected != got for expected, got in err.checksums)
    assert len({expected for expected, _ in err.checksums}) == 1  # one batch, the same bytes each time
    said = str(err)
    assert f"epoch 0 batch 0 failed {k} attempts in a row (batch_attempts={k})" in said, said
    assert f"expected {err.checksums[0][0]:#010x} from the data worker, got {err.checksums[0][1]:#010x}" in said
    assert took < ds.options.batch_timeout  # ended by its attempts, not by waiting out a deadline


@pytest.mark.slow
def test_a_batch_no_server_delivers_ends_after_batch_attempts_times_batch_timeout(server_factory):
    # Each batch takes 8 s to build; batch_timeout 0.5 s: every attempt is dropped as stalled.
    server = server_factory({"size": 64, "batch_size": 4, "sleep_ms": 2000}, num_workers=1)
    ds = RemoteDataset([server.address], TOKEN, seed=1, shared_memory=False, batch_timeout=0.5, connect_timeout=30)
    start = time.monotonic()
    with pytest.raises(BatchFailedError) as info:
        list(ds)
    took = time.monotonic() - start
    print(f"\n{took:.2f} s: {info.value}")
    assert (info.value.epoch, info.value.index) == (0, 0) and info.value.checksums == []
    assert str(info.value).count("no batch for 0.5s (batch_timeout): dropped") == 3, str(info.value)
    assert took >= 3 * ds.options.batch_timeout  # each attempt waited its batch_timeout


class _Hung(grpc.GenericRpcHandler):
    """A gRPC server that takes every call and answers none (a hung data server)."""

    def service(self, details):
        def hang(request, context):
            while context.is_active():
                time.sleep(0.05)

        return grpc.unary_unary_rpc_method_handler(hang)


@pytest.mark.serial  # it times the wait
def test_connect_timeout_bounds_the_first_hello_even_when_servers_take_it_and_never_answer():
    # Three addresses that take the Hello and never answer: each Hello waits at most what is left
    # of connect_timeout; before, 2 s each, so the deadline was first looked at after 6 s.
    from concurrent.futures import ThreadPoolExecutor

    hung = grpc.server(ThreadPoolExecutor(8))
    hung.add_generic_rpc_handlers((_Hung(),))
    servers = [f"127.0.0.1:{hung.add_insecure_port('127.0.0.1:0')}" for _ in range(3)]
    hung.start()
    try:
        start = time.monotonic()
        with pytest.raises(ServerUnavailableError) as info:
            list(RemoteDataset(servers, TOKEN, connect_timeout=1.0))
        waited = time.monotonic() - start
        print(f"\nconnect_timeout=1.0: raised after {waited:.2f} s")
        assert 1.0 <= waited < 2 * 1.0, waited
        assert all(a in str(info.value) for a in servers)
    finally:
        hung.stop(0)
