"""Faults, each run N times, counted through the audit log: nothing lost, nothing duplicated.

N is ``HETERO_FAULT_REPS`` (default 1) in the default run; ``-m slow`` repeats the cheap faults
``HETERO_FAULT_SLOW_REPS`` times (default 5). Builds on tests/test_service.py and
tests/test_multinode.py (single kill, single restart, single late start are tested there).
docs/faults.md lists the failure modes and the tests that guard them.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time

import pytest

from _fault_helpers import (REPS, SLOW_REPS, RawBulk, assert_exactly_once, bulk_port, slow_header_parse, stats,
                            wait_clean, wait_until)
from conftest import TOKEN
from data_service.contract.batch_id import BatchId
from data_service.protocol import framing
from data_service.contract.tensor_layout import batch_digest
from data_service.errors import BatchBuildError, ServerUnavailableError
from data_service.contract.pipeline import PipelineSpec
from data_service.contract.sampler import EpochShape, batch_indices
from data_service.protocol.generated import pb
from dnn_worker import RemoteDataset
from dnn_worker.fetch.fetch_options import FetchOptions
from dnn_worker.fetch.fetcher import Fetcher
from hetero.testing import ConsumerProc, FaultProxy, Reference, ServerProc, check_audit, free_port, read_audit

OPTS = {"size": 96, "batch_size": 4}            # 24 batches per epoch
SLOW_OPTS = {**OPTS, "work_ms": 10}             # ~40 ms per batch per worker: faults land mid-epoch

pytestmark = pytest.mark.timeout(240)


def reps(slow: bool) -> int:
    return SLOW_REPS if slow else REPS


def consume(ds, epoch: int, on_batch=None) -> int:
    ds.set_epoch(epoch)
    n = 0
    for _ in ds:
        n += 1
        if on_batch is not None:
            on_batch(n)
    return n


# ------------------------------------------------------------------ data server kill -9, rejoin

@pytest.mark.slow  # a server killed mid-epoch runs by default in test_multinode.py
@pytest.mark.parametrize("slow", [False, True])
def test_server_kill9_mid_epoch_then_the_restarted_server_rejoins(tmp_path, slow):
    rnd = random.Random(7)
    a, b = ServerProc(SLOW_OPTS, token=TOKEN), ServerProc(SLOW_OPTS, token=TOKEN)
    try:
        a.start(wait=False), b.start(wait=False)
        a.wait_ready(), b.wait_ready()
        audit = tmp_path / "audit.jsonl"
        ds = RemoteDataset([a.address, b.address], TOKEN, seed=3, window=3, audit_path=audit,
                           connect_timeout=60, batch_timeout=60)
        for rep in range(reps(slow)):
            victim = (a, b)[rep % 2]
            kill_at = rnd.randint(2, 16)

            def kill(n):
                if n == kill_at:
                    victim.kill()  # kill -9 of the process group, requests outstanding
                    victim.start(wait=False)  # same ports: it must be used again once up

            assert consume(ds, 2 * rep, kill) == 24
            victim.wait_ready()
            assert consume(ds, 2 * rep + 1) == 24  # both servers again
            assert stats(victim.address).batches_sent > 0, "the restarted server was not used again"
        assert_exactly_once(check_audit(audit, SLOW_OPTS, seed=3), expected=48 * reps(slow))
    finally:
        a.kill(), b.kill()


# ------------------------------------------------------------------ client disconnect, consumer restart

@pytest.mark.parametrize("slow", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_consumer_killed_mid_stream_frees_the_stream_and_resumes_from_its_audit(tmp_path, slow):
    server = ServerProc(OPTS, token=TOKEN).start()
    audit = tmp_path / "audit.jsonl"
    rnd = random.Random(11)
    try:
        consumer = ConsumerProc([server.address], 0, 1, audit, seed=5, epochs=1 + reps(slow), token=TOKEN,
                                step_s=0.03, log_path=tmp_path / "consumer.log")
        for rep in range(reps(slow)):
            consumer.start()
            target = 24 * rep + rnd.randint(2, 20)
            wait_until(lambda: len(read_audit(audit)) >= target, 120, f"{target} batches audited")
            consumer.kill()  # kill -9 mid-stream, requests outstanding
            wait_clean(server.address)  # stream, slots and queued tasks freed
        consumer.start()  # the last restart reads to the end
        consumer.proc.wait(120)
        assert consumer.proc.returncode == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        assert_exactly_once(check_audit(audit, OPTS, seed=5), expected=24 * (1 + reps(slow)))
    finally:
        server.kill()


# ------------------------------------------------------------------ slow consumer

@pytest.mark.slow
def test_slow_consumer_keeps_server_memory_within_its_bound(tmp_path):
    opts = {"size": 240, "batch_size": 4, "shape": [3, 96, 96]}  # 110 KB batches, 60 per epoch
    batch_bytes = 4 * 3 * 96 * 96 + 4 * 8 + 64
    server = ServerProc(opts, workers=2, slots=2, token=TOKEN).start()
    try:
        ds = RemoteDataset([server.address], TOKEN, window=32, audit_path=tmp_path / "a.jsonl")
        rss, slots, held = [], [], []

        def slow(n):
            time.sleep(0.05)  # a consumer ~10x slower than the server
            if n % 5 == 0:
                s = stats(server.address)
                slots.append(s.slots_in_use)
                held.append(s.bytes_in_slots)
                rss.append(sum(server.rss()))

        assert consume(ds, 0, slow) == 60
        assert max(slots) <= 4 and max(held) <= 4 * batch_bytes, (slots, held)
        growth = (max(rss[-3:]) - max(rss[:3])) / 2**20
        assert growth < 40, f"server RSS grew {growth:.1f} MiB over a slow-consumer run: {rss}"
        assert_exactly_once(check_audit(tmp_path / "a.jsonl", opts, seed=0), expected=60)
    finally:
        server.kill()


@pytest.mark.parametrize("shm", [False, True], ids=["tcp", "shared-memory"])
@pytest.mark.slow
def test_a_consumer_that_stops_reading_does_not_starve_the_others(shm):
    # 4 MB batches, one worker with 2 slots. Consumer A asks for 16 batches, then takes none and
    # stays connected (over TCP its socket fills up; with shared memory it never releases). Its
    # batches hold both slots. Consumer B must still get all its batches, long before A's send
    # timeout (60 s here; a shared-memory consumer is never timed out at all): the pool moves
    # A's stuck batches out of the worker's way.
    server = ServerProc({"size": 32, "batch_size": 2, "shape": [1, 512, 1024]}, workers=1, token=TOKEN,
                        send_timeout_s=60).start()
    frozen = RawBulk(bulk_port(server.address))
    try:
        frozen.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        welcome = frozen.login(shm=shm)
        assert welcome.WhichOneof("kind") == "welcome" and welcome.welcome.shm == shm, welcome
        frozen.fetch(pb.BatchRef(seed=1, epoch=0, index=i) for i in range(16))
        wait_until(lambda: stats(server.address).slots_in_use == 2, 30, "A holds both slots")
        box: list = []

        def other():
            try:
                box.append(len(list(RemoteDataset([server.address], TOKEN, connect_timeout=10, batch_timeout=10,
                                                  shared_memory=not shm))))
            except Exception as exc:  # noqa: BLE001
                box.append(exc)

        t0 = time.monotonic()
        t = threading.Thread(target=other, daemon=True)
        t.start()
        t.join(30)
        assert box == [16], f"consumer B got {box or 'nothing'} within 30 s while A took nothing"
        assert time.monotonic() - t0 < 20
        # A's stuck batches stay within the cap, and A is still served once it reads.
        assert stats(server.address).slots_in_use <= 2 + 8
        frozen.sock.settimeout(10)
        first = framing.recv_frame(frozen.sock)
        assert first.WhichOneof("kind") == "batch" and first.batch.ref.index == 0, first
    finally:
        frozen.close()
        server.kill()


@pytest.mark.slow
def test_ranks_holding_their_windows_of_shared_memory_batches_do_not_starve_the_rank_behind():
    # DDP in lock step: three ranks got ahead, hold a full window (8) of leased or copied-out-later
    # shared-memory batches each and wait in an all-reduce for the fourth, which needs the server's
    # only worker. Every one of those 24 batches was asked for, so the pool must move them all out of
    # the worker's way (at most a window per connection); a cap on all connections together left
    # the fourth rank waiting forever, and with it the whole job.
    server = ServerProc({"size": 80, "batch_size": 4}, workers=1, token=TOKEN).start()
    ahead = [RawBulk(bulk_port(server.address)) for _ in range(3)]
    try:
        for rank, raw in enumerate(ahead):
            assert raw.login(shm=True).welcome.shm
            raw.fetch(pb.BatchRef(seed=rank, epoch=0, index=i) for i in range(8))
        deadline, sent, since = time.monotonic() + 10, -1, time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - since < 1.0:  # until the pool stops building
            now_sent = stats(server.address).batches_sent
            if now_sent != sent:
                sent, since = now_sent, time.monotonic()
            time.sleep(0.1)
        assert sent >= 10, f"only {sent} of the three ranks' batches were built"
        box: list = []

        def behind():
            try:
                box.append(len(list(RemoteDataset([server.address], TOKEN, seed=9, connect_timeout=10,
                                                  batch_timeout=10))))
            except Exception as exc:  # noqa: BLE001
                box.append(exc)

        t = threading.Thread(target=behind, daemon=True)
        t.start()
        t.join(30)
        assert box == [20], f"the rank behind got {box or 'nothing'} within 30 s"
    finally:
        for raw in ahead:
            raw.close()
        server.kill()


def test_a_consumer_holding_its_own_zero_copy_batch_still_gets_the_worker_from_a_stalled_one():
    # A rank reading from two servers holds a batch that came early (zero copy, leased) while it
    # waits for an earlier one; the worker's other slot holds a batch of a rank stalled in an
    # all-reduce. The waiting rank's next batch must get that other slot: the pool looked only at
    # the oldest stuck slot, found it was the waiting rank's own, and gave up (a 4-rank job hung).
    server = ServerProc({"size": 80, "batch_size": 4}, workers=1, token=TOKEN).start()
    waiting, stalled = RawBulk(bulk_port(server.address), timeout=5), RawBulk(bulk_port(server.address))
    try:
        assert waiting.login(shm=True).welcome.shm and stalled.login(shm=True).welcome.shm
        waiting.fetch([pb.BatchRef(seed=0, epoch=0, index=0)])
        held = framing.recv_frame(waiting.sock).batch
        assert held.ref.index == 0 and held.shm_lease  # kept zero copy: never released here
        stalled.fetch([pb.BatchRef(seed=1, epoch=0, index=0)])  # built into the other slot, never taken
        wait_until(lambda: stats(server.address).batches_built == 2, 10, "the stalled rank's batch is built")
        time.sleep(0.5)  # both slots are stuck now
        waiting.fetch([pb.BatchRef(seed=0, epoch=0, index=1)])
        try:
            frame = framing.recv_frame(waiting.sock)
        except socket.timeout:
            pytest.fail("the waiting rank's batch was not built within 5 s: the worker stays blocked")
        assert frame.batch.ref.index == 1
    finally:
        waiting.close()
        stalled.close()
        server.kill()


@pytest.mark.parametrize("shared_memory", [False, True], ids=["tcp", "shared-memory"])
@pytest.mark.slow
def test_an_iterator_broken_off_and_kept_alive_does_not_stall_the_next_one(shared_memory):
    # A training loop that breaks out of one epoch's iterator and starts another without closing
    # the first: the first one's requested batches must not hold the server's only worker. (8 MB
    # batches: more than loopback's socket buffers take, so over TCP they wait in the slots too.)
    server = ServerProc({"size": 16, "batch_size": 2, "shape": [1, 1024, 1024]}, workers=1, token=TOKEN).start()
    try:
        first = iter(RemoteDataset([server.address], TOKEN, shared_memory=shared_memory, window=8))
        next(first), next(first)
        t0 = time.monotonic()
        n = sum(1 for _ in RemoteDataset([server.address], TOKEN, shared_memory=shared_memory,
                                         connect_timeout=10, batch_timeout=15))
        assert n == 8 and time.monotonic() - t0 < 15, (n, time.monotonic() - t0)
        assert len(list(first)) == 6  # and the first one still ends its epoch
    finally:
        server.kill()


# ------------------------------------------------------------------ worker killed or crashing

@pytest.mark.parametrize("slow", [pytest.param(False, marks=pytest.mark.slow),
                                  pytest.param(True, marks=pytest.mark.slow)])
def test_worker_kill9_mid_epoch_is_rebuilt_without_gap_or_duplicate(tmp_path, slow):
    server = ServerProc(SLOW_OPTS, workers=2, token=TOKEN).start()
    rnd = random.Random(3)
    audit = tmp_path / "audit.jsonl"
    try:
        ds = RemoteDataset([server.address], TOKEN, seed=1, window=4, audit_path=audit, connect_timeout=60)
        kills = 0
        for rep in range(reps(slow)):
            kill_at = rnd.randint(2, 18)

            def kill(n):
                nonlocal kills
                if n == kill_at:
                    pids = server.worker_pids()
                    assert len(pids) == 2, pids
                    os.kill(rnd.choice(pids), signal.SIGKILL)
                    kills += 1

            assert consume(ds, rep, kill) == 24
            # Replaced and ready, not merely started: the next kill must not hit a replacement still
            # loading the pipeline (that death is retried within the same replacement, one restart).
            wait_until(lambda: stats(server.address).worker_restarts == kills, 90, f"{kills} worker restarts")
            wait_until(lambda: len(server.worker_pids()) == 2, 30, "the two workers alone")  # none being reaped
        assert_exactly_once(check_audit(audit, SLOW_OPTS, seed=1), expected=24 * reps(slow))
    finally:
        server.kill()


def test_a_worker_killed_before_the_server_opened_its_new_slot_loses_no_batch(monkeypatch, tmp_path):
    # A worker reports a batch built into a new region (/proc/<worker pid>/fd/<n>), then dies on
    # its next batch before the dispatcher opens that region: the path is gone with the process.
    # The batch must be rebuilt, not dropped (it was: the consumer waited out batch_timeout).
    # A slow parse of batch 1's header holds the dispatcher while the worker builds batch 2 and
    # dies (sample 13); one worker, two slots, so batches 0 and 1 each open a new region.
    import queue

    from data_service.contract.batch_id import BatchId
    from data_service.pool import worker_pool as workers

    slow_header_parse(monkeypatch, lambda header: 1.5 if header.ref.index == 1 else 0.0)
    opts = {"size": 36, "batch_size": 6, "shuffle": False, "crash_once_at": 13, "crash_marker": str(tmp_path / "m")}
    pool = workers.WorkerPool(PipelineSpec("examples.synthetic:build_pipeline", opts).to_json(), 1, slots_per_worker=2)
    pool.start()
    results: queue.Queue = queue.Queue()

    def take(result):
        results.put((result.task.batch.index, result.error))
        result.release()  # at once, as a fast consumer does: batch 2 goes out while batch 1 is parsed

    try:
        for i in range(6):
            pool.submit(workers.Task(BatchId(0, 0, i), take))
        got = []
        for _ in range(6):
            try:
                got.append(results.get(timeout=30))
            except queue.Empty:
                pytest.fail(f"batches {sorted(set(range(6)) - {i for i, _ in got})} never came back")
        assert (tmp_path / "m").exists()  # the worker really died
        assert sorted(i for i, _ in got) == list(range(6))
        assert [e for _, e in got if e is not None] == []
        wait_until(lambda: pool.restarts == 1, 30, "the dead worker is replaced")
    finally:
        pool.stop()


@pytest.mark.slow
def test_a_worker_that_crashes_on_one_batch_on_two_servers_loses_nothing(server_factory, tmp_path):
    # Both servers crash their worker on the same sample once (a marker per server): the batch is
    # rebuilt on whichever server gets it; ranks 0 and 1 see their whole share exactly once.
    opts = {"size": 96, "batch_size": 4, "shuffle": False, "crash_once_at": 37, "crash_marker": str(tmp_path / "m")}
    servers = [server_factory(opts, probe=False) for i in range(2)]
    audit = tmp_path / "audit.jsonl"
    for rank in range(2):
        ds = RemoteDataset([s.address for s in servers], TOKEN, seed=2, rank=rank, world_size=2, audit_path=audit)
        assert consume(ds, 0) == 12
    assert (tmp_path / "m").exists()  # a worker really died
    ref_opts = {**opts, "crash_once_at": None, "crash_marker": None}
    assert_exactly_once(check_audit(audit, ref_opts, seed=2, world=2), expected=24)


# ------------------------------------------------------------------ transform raising on one sample

@pytest.mark.parametrize("slow", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_transform_raising_on_one_sample_names_it_and_the_servers_stay_clean(server_factory, slow):
    rnd = random.Random(5)
    opts = {"size": 96, "batch_size": 4}
    for rep in range(reps(slow)):
        bad_sample = rnd.randrange(96)
        o = {**opts, "fail_at": bad_sample}
        servers = [server_factory(o, probe=False, num_workers=1) for _ in range(2)]
        epoch = rnd.randrange(5)
        cfg = EpochShape(96, 4)
        bad_batch = next(i for i in range(24) if bad_sample in batch_indices(cfg, 9, epoch, i))
        ds = RemoteDataset([s.address for s in servers], TOKEN, seed=9)
        with pytest.raises(BatchBuildError) as info:
            consume(ds, epoch)
        err = info.value
        assert (err.epoch, err.index, err.sample_index) == (epoch, bad_batch, bad_sample)
        assert f"synthetic failure on sample {bad_sample}" in str(err)
        for s in servers:  # the aborted iteration left nothing behind
            wait_clean(s.address)
        good = [BatchId(9, epoch, i) for i in range(24) if i != bad_batch]
        got = {ref.index: batch_digest(b) for ref, b in Fetcher([s.address for s in servers], good, FetchOptions(TOKEN))}
        ref = Reference("examples.synthetic:build_pipeline", opts, 9).digests(epoch)
        assert got == {i: ref[i] for i in got} and len(got) == 23
        for s in servers:
            s.shutdown(grace_s=1)


# ------------------------------------------------------------------ late start, never start

@pytest.mark.slow
def test_servers_starting_late_at_different_times(tmp_path):
    late = [ServerProc(OPTS, token=TOKEN), ServerProc(OPTS, token=TOKEN)]
    timers = [threading.Timer(d, s.start, kwargs={"wait": False}) for d, s in zip((1.0, 4.0), late)]
    audit = tmp_path / "audit.jsonl"
    try:
        start = time.monotonic()
        for t in timers:
            t.start()
        ds = RemoteDataset([s.address for s in late], TOKEN, seed=4, audit_path=audit, connect_timeout=90)
        for epoch in range(2):
            assert consume(ds, epoch) == 24
        assert time.monotonic() - start >= 1.0
        assert_exactly_once(check_audit(audit, OPTS, seed=4), expected=48)
    finally:
        for t in timers:
            t.cancel()
        for s in late:
            s.kill()


def test_servers_never_starting_is_a_clean_error_within_the_deadline():
    import socket

    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    # A port that accepts TCP but never speaks (a hung process): a "server" that never starts either.
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    dead.append(f"127.0.0.1:{mute.getsockname()[1]}")
    try:
        for servers in (dead[:2], dead[2:], dead):
            start = time.monotonic()
            with pytest.raises(ServerUnavailableError) as info:
                list(RemoteDataset(servers, TOKEN, connect_timeout=2.0))
            waited = time.monotonic() - start
            assert 2.0 <= waited < 2.0 + 2.5 * len(servers) + 5, waited
            for address in servers:
                assert address in str(info.value)
    finally:
        mute.close()


@pytest.mark.slow
def test_every_server_gone_mid_epoch_is_a_clean_error_naming_each(tmp_path):
    a, b = ServerProc(SLOW_OPTS, token=TOKEN), ServerProc(SLOW_OPTS, token=TOKEN)
    a.start(wait=False), b.start(wait=False)
    a.wait_ready(), b.wait_ready()
    audit = tmp_path / "audit.jsonl"
    try:
        ds = RemoteDataset([a.address, b.address], TOKEN, window=2, audit_path=audit, connect_timeout=3)
        killed_at = []

        def kill(n):
            if n == 5:
                a.kill(), b.kill()
                killed_at.append(time.monotonic())

        with pytest.raises(ServerUnavailableError) as info:
            consume(ds, 0, kill)
        assert time.monotonic() - killed_at[0] < 3 + 15
        assert a.address in str(info.value) and b.address in str(info.value)
        acc = check_audit(audit, SLOW_OPTS, seed=0, complete=False)
        assert_exactly_once(acc)  # what came before the failure came exactly once, in order
    finally:
        a.kill(), b.kill()


# ------------------------------------------------------------------ network faults through a proxy

def _proxied_servers(server_factory, opts, n=2, **proxy_kw):
    proxies, servers = [], []
    for _ in range(n):
        bulk = free_port()
        proxy = FaultProxy(("127.0.0.1", bulk), **proxy_kw)
        proxies.append(proxy)
        servers.append(server_factory(opts, num_workers=1, bulk_port=bulk, advertise_bulk_port=proxy.port))
    return proxies, servers


@pytest.mark.parametrize("slow", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_proxy_drops_connections_mid_stream(server_factory, tmp_path, slow):
    proxies, servers = _proxied_servers(server_factory, SLOW_OPTS)
    audit = tmp_path / "audit.jsonl"
    rnd = random.Random(1)
    try:
        ds = RemoteDataset([s.address for s in servers], TOKEN, seed=6, window=3, audit_path=audit)
        cuts = 0
        for rep in range(reps(slow)):
            cut_at = set(rnd.sample(range(2, 22), 3))

            def cut(n):
                nonlocal cuts
                if n in cut_at:
                    cuts += proxies[n % 2].cut()

            assert consume(ds, rep, cut) == 24
        assert cuts >= 1
        assert_exactly_once(check_audit(audit, SLOW_OPTS, seed=6), expected=24 * reps(slow))
        ds.close()  # training over: its connections, kept for a next epoch, close now
        for s in servers:
            wait_clean(s.address)
    finally:
        for p in proxies:
            p.close()


def test_proxy_cutting_every_connection_after_some_bytes_still_completes(server_factory, tmp_path):
    # Every data-plane connection dies after ~3 batches: the consumer reconnects again and again.
    proxies, servers = _proxied_servers(server_factory, OPTS, n=1, cut_after_bytes=700)
    audit = tmp_path / "audit.jsonl"
    try:
        ds = RemoteDataset([servers[0].address], TOKEN, seed=2, window=2, audit_path=audit, connect_timeout=30)
        assert consume(ds, 0) == 24
        assert proxies[0].cuts >= 2
        assert_exactly_once(check_audit(audit, OPTS, seed=2), expected=24)
    finally:
        proxies[0].close()


@pytest.mark.slow
def test_a_delayed_and_a_silently_stalled_link(server_factory, tmp_path):
    # One link is slow (20 ms per chunk), the other goes silent mid-epoch without closing (no RST):
    # after batch_timeout its batches are asked of the slow one; nothing lost or duplicated.
    proxies, servers = _proxied_servers(server_factory, SLOW_OPTS)
    proxies[0].delay_s = 0.02
    audit = tmp_path / "audit.jsonl"
    try:
        ds = RemoteDataset([s.address for s in servers], TOKEN, seed=8, window=3, audit_path=audit,
                           batch_timeout=3, connect_timeout=30)
        start = time.monotonic()
        assert consume(ds, 0, lambda n: n == 4 and proxies[1].stall(True)) == 24
        assert time.monotonic() - start < 60
        proxies[1].stall(False)
        assert consume(ds, 1) == 24
        assert_exactly_once(check_audit(audit, SLOW_OPTS, seed=8), expected=48)
    finally:
        for p in proxies:
            p.close()


@pytest.mark.slow
def test_a_silently_stalled_server_slows_the_consumer_without_stopping_it_or_piling_batches_up(server_factory):
    # One of two links goes silent (no RST) early in a 200-batch list; batch_timeout is far off.
    # (Shared memory: the server keeps a slot until the consumer releases it, copies dropped too.)
    # The consumer may ask for at most 2 x window x servers batches ahead of the one it waits for,
    # and then asks the live server for that one too: the list completes long before
    # batch_timeout, in order, each batch once, holding at most that bound. Before, the live
    # server was asked for the whole rest of the list, every batch of it waited in the consumer,
    # and nothing was yielded until batch_timeout dropped the stalled server.
    opts = {"size": 800, "batch_size": 4, "shape": [1, 16, 16]}
    proxies, servers = _proxied_servers(server_factory, opts)
    try:
        refs = [BatchId(3, 0, i) for i in range(200)]
        fetcher = Fetcher([s.address for s in servers], refs,
                          FetchOptions(TOKEN, window=3, batch_timeout=60, connect_timeout=30, shared_memory=True),
                          keep_open=True)
        got, start = {}, time.monotonic()
        for ref, batch in fetcher:
            got[ref.index] = batch_digest(batch)
            if len(got) == 10:
                proxies[1].stall(True)
        took = time.monotonic() - start
        assert list(got) == list(range(200))
        assert list(got.values()) == Reference("examples.synthetic:build_pipeline", opts, 3).digests(0)
        assert took < 30, f"{took:.1f}s: the consumer waited for batch_timeout (60 s)"
        assert fetcher.hedges > 0 and fetcher.most_held <= 2 * 3 * 2, (fetcher.hedges, fetcher.most_held)
        # The next epoch on the same connections (a persistent loader worker), the link back: the
        # stalled server's copies of epoch 0 that lost now come, and must be dropped.
        proxies[1].stall(False)
        later = [BatchId(3, 1, i) for i in range(40)]
        again = {r.index: batch_digest(b) for r, b in Fetcher([s.address for s in servers], later,
                                                               FetchOptions(TOKEN, window=3, batch_timeout=60),
                                                               reuse=fetcher)}
        assert list(again.values()) == Reference("examples.synthetic:build_pipeline", opts, 3).digests(1)[:40]
        assert time.monotonic() - start < 40
        wait_clean(servers[0].address)  # the copies it sent that came second were released too
    finally:
        for p in proxies:
            p.close()


def test_a_slow_pipeline_is_not_hedged_at_the_end_of_the_list(server_factory, monkeypatch):
    # At the end of the list the awaited batch is hedged only once its server has been quiet for
    # HEDGE_TAIL_S or 4 of its usual gaps between batches, whichever is longer: a pipeline that
    # takes longer than HEDGE_TAIL_S per batch is slow, not stalled, and building its batches
    # twice at every epoch's end would only take CPU from other consumers. (HEDGE_TAIL_S is cut
    # to 50 ms so that 0.2 s batches are "slow".)
    from dnn_worker.fetch import scheduler

    monkeypatch.setattr(scheduler, "HEDGE_TAIL_S", 0.05)
    opts = {"size": 48, "batch_size": 4, "work_ms": 50}  # about 0.2 s per batch per worker
    servers = [server_factory(opts, num_workers=1) for _ in range(2)]
    refs = [BatchId(4, 0, i) for i in range(12)]
    fetcher = Fetcher([s.address for s in servers], refs, FetchOptions(TOKEN, window=2))
    assert [r.index for r, _ in fetcher] == list(range(12))
    assert fetcher.hedges == 0


# ------------------------------------------------------------------ resume and the audit log

@pytest.mark.slow
def test_resume_with_loader_workers_audits_each_batch_once(server_factory, tmp_path):
    from torch.utils.data import DataLoader

    from dnn_worker import ResumableLoader

    server = server_factory(OPTS, num_workers=1)
    audit = tmp_path / "audit.jsonl"

    def loader():
        return ResumableLoader(DataLoader(RemoteDataset([server.address], TOKEN, seed=1, audit_path=audit),
                                          batch_size=None, num_workers=2, multiprocessing_context="spawn"))

    first = loader()
    first.set_epoch(0)
    for n, _ in enumerate(first, 1):
        if n == 5:
            state = first.state_dict()  # spot stop after 5 steps
            break
    # A stopped trainer's loader workers go with its process; here they would live on, paused, and a
    # paused consumer holds up to its window of built batches in the server's slots until it reads
    # again or the server's send timeout drops it (docs/consumer.md).
    first.close()
    resumed = loader()
    resumed.load_state_dict(state)
    resumed.set_epoch(0)
    assert sum(1 for _ in resumed) == 19  # resume itself is right ...
    assert_exactly_once(check_audit(audit, OPTS, seed=1), expected=24)  # ... but the audit says 2x


# ------------------------------------------------------------------ trainer crash, spot stop (launcher)

def _cluster(tmp_path, data_nodes: int, **hps):
    from _launcher_helpers import SYNTHETIC_HPS, synth_data
    from hetero.local.runner import LocalCluster
    from hetero.local.tree import build_nodes

    data = synth_data(tmp_path / "data", 16, 0)
    hp = {**SYNTHETIC_HPS, "loader_workers": 0, "emulate_step_s": 0.05, "evaluate": "", **hps}
    nodes = build_nodes(tmp_path / "nodes", data_nodes, 1, False, data, hp, "fault-job")
    return LocalCluster(nodes, hp, tmp_path / "logs", echo=False), nodes


def _logs(tmp_path) -> str:
    return "\n".join(f"--- {p.name}\n" + p.read_text()[-2500:] for p in sorted((tmp_path / "logs").glob("*.log")))


@pytest.mark.slow
def test_trainer_killed_every_data_node_exits_within_its_watchdog_deadline(tmp_path):
    # kill -9 of the whole DNN node (no Shutdown call can come): each data node's watchdog must end
    # it (exit 4, "consumers gone") within watchdog_idle_s plus a poll.
    audit = tmp_path / "audit.jsonl"
    cluster, nodes = _cluster(tmp_path, 2, audit_path=str(audit), epochs=100, watchdog_idle_s=4)
    cluster.start()
    try:
        wait_until(lambda: len(read_audit(audit)) >= 5, 150, "training under way")
        dnn = cluster.procs[nodes[0].host]
        os.killpg(dnn.pid, signal.SIGKILL)
        killed = time.monotonic()
        data_procs = {n.host: cluster.procs[n.host] for n in nodes if n.role == "data"}
        wait_until(lambda: all(p.poll() is not None for p in data_procs.values()), 4 + 30,
                   "every data node exits after the trainer was killed")
        assert time.monotonic() - killed < 34
        assert {h: p.returncode for h, p in data_procs.items()} == {h: 4 for h in data_procs}, _logs(tmp_path)
    finally:
        cluster.stop()


@pytest.mark.slow  # the default run keeps the SIGTERM checkpoint-and-resume tests of test_resume.py
def test_sigterm_to_the_trainer_checkpoints_and_the_job_resumes_the_epoch(tmp_path):
    # SageMaker stops a spot job with SIGTERM to the container's process (the launcher), then SIGKILL
    # after ~120 s. Expected: the trainer saves model + ResumableLoader.state_dict() under
    # $HETERO_SM_ROOT/checkpoints (/opt/ml/checkpoints), the DNN node shuts every data server down and
    # exits; the job started again on the same trees resumes mid-epoch: over both runs the audit shows
    # every batch of the epoch exactly once.
    audit = tmp_path / "audit.jsonl"
    cluster, nodes = _cluster(tmp_path, 1, audit_path=str(audit), epochs=1, **{"pipeline.size": 800})  # 100 steps
    dnn_node = nodes[0]
    ckpt = dnn_node.root / "checkpoints"
    cluster.start()
    try:
        wait_until(lambda: len(read_audit(audit)) >= 10, 150, "training under way")
        cluster.procs[dnn_node.host].send_signal(signal.SIGTERM)
        wait_until(lambda: all(p.poll() is not None for p in cluster.procs.values()), 60,
                   "DNN and data nodes stop after SIGTERM")
        assert ckpt.is_dir() and any(ckpt.rglob("*")), f"no checkpoint under {ckpt}\n{_logs(tmp_path)}"
        assert 10 <= len(read_audit(audit)) < 100
    finally:
        cluster.stop()
    from hetero.local.runner import LocalCluster

    again = LocalCluster(nodes, cluster.hyperparameters, tmp_path / "logs2", echo=False)  # same trees and ports
    again.start()
    codes = again.wait(timeout_s=180)
    assert set(codes.values()) == {0}, _logs(tmp_path)
    opts = {"size": 800, "batch_size": 8}
    assert_exactly_once(check_audit(audit, opts, seed=0), expected=100)


def test_a_worker_killed_while_its_replacement_loads_is_replaced_again(tmp_path):
    server = ServerProc(OPTS, workers=1, token=TOKEN, spare_worker=False).start()  # replacements load when needed
    try:
        first = server.worker_pids()
        assert len(first) == 1
        os.kill(first[0], signal.SIGKILL)
        fresh: list[int] = []

        def replacement_spawned() -> bool:
            fresh[:] = [p for p in server.worker_pids() if p not in first]
            return bool(fresh)

        wait_until(replacement_spawned, 60, "a replacement worker process appears", poll=0.02)
        os.kill(fresh[0], signal.SIGKILL)  # a second fault while it imports the pipeline
        wait_until(lambda: stats(server.address).workers == 1, 30, "the server has a worker again")
        ds = RemoteDataset([server.address], TOKEN, batch_timeout=30, connect_timeout=30)
        assert consume(ds, 0) == 24
    finally:
        server.kill()


def _dying_loads(tmp_path, times: int, armed: bool = True):
    """Pipeline options under which the first ``times`` worker loads SIGKILL themselves (counted in
    the returned directory), once that directory exists (``armed`` creates it now)."""
    deaths = tmp_path / "deaths"
    if armed:
        deaths.mkdir()
    return {**OPTS, "die_loading": times, "die_loading_dir": str(deaths)}, deaths


@pytest.mark.slow
def test_a_worker_killed_while_the_server_starts_is_started_again(tmp_path):
    opts, deaths = _dying_loads(tmp_path, 2)
    server = ServerProc(opts, workers=1, token=TOKEN).start()  # raises if the server gives up
    try:
        assert len(os.listdir(deaths)) == 2  # two workers really died while loading
        st = stats(server.address)
        assert (st.workers, st.worker_restarts) == (1, 2)
        ds = RemoteDataset([server.address], TOKEN, batch_timeout=30, connect_timeout=30)
        assert consume(ds, 0) == 24
    finally:
        server.kill()


@pytest.mark.slow
def test_a_worker_that_dies_on_every_start_fails_the_server_with_a_clear_error(tmp_path):
    opts, deaths = _dying_loads(tmp_path, 100)
    log = tmp_path / "server.log"
    server = ServerProc(opts, workers=1, token=TOKEN, log_path=log)
    with pytest.raises(RuntimeError, match="exited with"):
        server.start(timeout=90)
    text = log.read_text()
    assert "data worker 0 was killed by SIGKILL (-9) while loading the pipeline; gave up after 4 attempts" in text, text
    assert len(os.listdir(deaths)) == 4


@pytest.mark.slow
def test_a_server_whose_workers_cannot_be_replaced_says_not_serving_and_refuses_at_once(
        server_factory, tmp_path, monkeypatch):
    from grpc_health.v1 import health_pb2

    from data_service.pool import lifecycle

    monkeypatch.setattr(lifecycle, "RESPAWN_BACKOFF_S", (0.1,))  # two replacement attempts
    opts, deaths = _dying_loads(tmp_path, 100, armed=False)  # the first worker loads fine
    server = server_factory(opts, num_workers=1, spare_worker=False)  # no spare loaded before the fault
    deaths.mkdir()  # armed: every replacement dies
    os.kill(server.pool.worker_pids()[0], signal.SIGKILL)
    wait_until(lambda: server.pool.no_workers, 60, "the server gives up replacing its worker")
    assert len(os.listdir(deaths)) == 2
    status = server._health.Check(health_pb2.HealthCheckRequest(service=""), None).status
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    t0 = time.monotonic()
    ds = RemoteDataset([server.address], TOKEN, batch_timeout=30, connect_timeout=5)
    with pytest.raises(ServerUnavailableError, match="no data worker left"):
        consume(ds, 0)
    assert time.monotonic() - t0 < 20  # refused, not left to time out
