"""The consumer's scheduler with fake servers and a fake clock: shares follow speed, the head of
the line is never stuck behind a slow or stalled server, affinity holds, nothing is lost."""
from __future__ import annotations

import collections

import pytest

from data_service.contract.batch_id import BatchId
from data_service.protocol.generated import pb
from dnn_worker.fetch.affinity import Affinity
from dnn_worker.fetch.in_order import InOrderBuffer
from dnn_worker.fetch.scheduler import AHEAD_WINDOWS, Scheduler


class FakeServer:
    """Builds what it is asked, first asked first, ``workers`` at a time, ``per_batch`` seconds each
    (``slow_after``: from that many batches on, ``slow_per_batch`` instead: a noisy neighbour or a stall)."""

    def __init__(self, address: str, per_batch: float, workers: int = 1, slow_after: int | None = None,
                 slow_per_batch: float = 1e9) -> None:
        self.address, self.per_batch, self.workers = address, per_batch, workers
        self.slow_after, self.slow_per_batch = slow_after, slow_per_batch
        self.queue: collections.deque = collections.deque()
        self.running: list[tuple[float, pb.BatchRef]] = []
        self.built = 0
        self.asked = 0
        self.frames: list[int] = []

    def ask(self, refs, now):
        self.queue.extend(refs)
        self.asked += len(refs)
        self.frames.append(len(refs))
        self._start(now)

    def _start(self, now):
        while self.queue and len(self.running) < self.workers:
            slow = self.slow_after is not None and self.built + len(self.running) >= self.slow_after
            self.running.append((now + (self.slow_per_batch if slow else self.per_batch), self.queue.popleft()))
            self.running.sort(key=lambda x: x[0])

    def next_time(self):
        return self.running[0][0] if self.running else None

    def finish(self, now):
        done = []
        while self.running and self.running[0][0] <= now:
            done.append(self.running.pop(0)[1])
            self.built += 1
        self._start(now)
        return done


def simulate(servers, n, *, window=4, affinity=None, consume_s=0.0, until=1e6, sched=None):
    """Run the scheduler against ``servers`` for ``n`` batches of one list; the consumer takes each
    batch ``consume_s`` after the one before. Returns (finish time, scheduler, buffer)."""
    refs = [BatchId(1, 0, i) for i in range(n)]
    sched = sched or Scheduler(refs, affinity=affinity)
    for s in servers:
        sched.lanes.lane(s.address, window, float(s.workers))
    out = InOrderBuffer(n)
    by = {s.address: s for s in servers}
    now, consumer_free = 0.0, 0.0
    while not out.finished and now < until:
        for _ in out.ready():
            consumer_free = max(consumer_free, now) + consume_s
        if out.finished:
            break
        owners = tuple(by)
        orders = sched.plan(out.next, list(by), owners, now)
        for address, asked in orders.fetch.items():
            assert len(sched.lanes[address].outstanding) <= sched.lanes[address].window
            by[address].ask(asked, now)
        times = [t for t in (s.next_time() for s in servers) if t is not None]
        now = max(now, min(times)) if times else now + 0.01
        for s in servers:
            for ref in s.finish(now):
                if sched.arrived(s.address, ref, 1 << 21, now):
                    out.put(sched.batches.index_of(ref), ref)
    return now, sched, out


def test_one_server_takes_everything_in_order_within_its_window():
    s = FakeServer("a:1", 0.01)
    end, sched, out = simulate([s], 100, window=4)
    assert out.finished and s.built == 100 and sched.hedges == 0
    assert end == pytest.approx(1.0, rel=0.02)
    assert all(n >= 2 for n in s.frames[:-1]), f"requests go out half a window at a time: {s.frames}"


@pytest.mark.parametrize("ratio", [1, 2, 3, 5])
def test_shares_follow_measured_speed(ratio):
    """A server ``ratio`` times faster gets about ``ratio`` times the batches, and the list takes
    about what both servers' throughputs together allow (equal shares would pace it by the slow one)."""
    fast, slow = FakeServer("fast:1", 0.01), FakeServer("slow:1", 0.01 * ratio)
    n = 600
    end, sched, _ = simulate([fast, slow], n)
    ideal = n / (1 / 0.01 + 1 / (0.01 * ratio))
    assert end < 1.10 * ideal, f"{end:.3f}s against {ideal:.3f}s with both servers' throughput"
    assert fast.built / slow.built == pytest.approx(ratio, rel=0.2), (fast.built, slow.built)
    assert sched.hedges <= n * 0.02


def test_a_server_that_slows_down_mid_list_loses_its_share():
    steady, neighbour = FakeServer("a:1", 0.01), FakeServer("b:1", 0.01, slow_after=50, slow_per_batch=0.05)
    n = 800
    end, sched, _ = simulate([steady, neighbour], n)
    ideal = 100 * 0.01 / 2 + (n - 100) / (100 + 20)  # both at 100/s for 100 batches, then 100/s + 20/s
    assert end < 1.15 * ideal, (end, ideal)
    assert steady.built > 4 * (neighbour.built - 50)


def test_a_stalled_server_is_hedged_in_a_few_of_its_gaps_not_at_a_timeout():
    a, b = FakeServer("a:1", 0.01), FakeServer("b:1", 0.01, slow_after=20)  # b stops after 20 batches
    end, sched, out = simulate([a, b], 300, until=100)
    assert out.finished, "the list must complete without the stalled server"
    assert end < 300 * 0.01 * 1.3 + 1.0, end
    assert sched.hedges >= 1
    assert len(sched.lanes["b:1"].outstanding) <= 4, "a stalled server is given no more than its window"
    assert sched.lanes.stalled(end + 301, 300) == ["b:1"], "it is dropped after batch_timeout"


def test_steady_slow_servers_are_not_hedged_at_the_tail():
    servers = [FakeServer(f"s{i}:1", 0.2) for i in range(2)]
    _, sched, _ = simulate(servers, 12, window=2)
    assert sched.hedges == 0


def test_nothing_is_asked_beyond_the_bound_ahead_of_the_awaited_batch():
    a, b = FakeServer("a:1", 0.001), FakeServer("b:1", 5.0)
    refs = [BatchId(1, 0, i) for i in range(200)]
    sched = Scheduler(refs)
    _, _, out = simulate([a, b], 200, window=3, sched=sched)
    assert out.finished and out.most_held <= AHEAD_WINDOWS * 3 * 2, out.most_held


def test_a_lost_server_s_batches_go_back_in_order_and_come_once():
    refs = [BatchId(1, 0, i) for i in range(20)]
    sched = Scheduler(refs)
    sched.lanes.lane("a:1", 4)
    sched.lanes.lane("b:1", 4)
    orders = sched.plan(0, ["a:1", "b:1"], (), 0.0)
    owed = [r.index for r in orders.fetch["a:1"]]
    assert owed and sched.lost("a:1") == len(owed) and sched.failovers == 1
    assert [r.index for r in sched.todo][:len(owed)] == sorted(owed)
    orders = sched.plan(0, ["b:1"], (), 1.0)
    got = [r.index for r in orders.fetch.get("b:1", [])]
    assert not sched.arrived("a:1", refs[owed[0]], 10, 1.0), "a late copy from the lost server is not used"
    assert set(got) <= set(range(20))


def test_a_shutting_down_server_s_declined_batch_is_asked_of_another():
    refs = [BatchId(1, 0, i) for i in range(4)]
    sched = Scheduler(refs)
    sched.lanes.lane("a:1", 4)
    orders = sched.plan(0, ["a:1"], (), 0.0)
    assert [r.index for r in orders.fetch["a:1"]] == [0, 1, 2, 3]
    assert sched.declined("a:1", refs[0], requeue=True)
    assert not sched.declined("a:1", refs[0], requeue=True), "declined once"
    sched.lanes.lane("b:1", 4)
    assert [r.index for r in sched.plan(0, ["b:1"], (), 0.1).fetch["b:1"]] == [0]


def _hedged_head():
    """A scheduler whose batch 0 is owed by a quiet "a:1" and, hedged, by "b:1"."""
    refs = [BatchId(1, 0, i) for i in range(4)]
    sched = Scheduler(refs)
    sched.lanes.lane("a:1", 4)
    assert [r.index for r in sched.plan(0, ["a:1"], (), 0.0).fetch["a:1"]] == [0, 1, 2, 3]
    sched.lanes.lane("b:1", 4)
    assert [r.index for r in sched.plan(0, ["a:1", "b:1"], (), 5.0).fetch["b:1"]] == [0]  # the tail: hedged
    assert sched.hedges == 1
    return refs, sched


@pytest.mark.parametrize("first", ["a:1", "b:1"])
def test_a_hedged_copy_s_error_is_no_error_while_the_other_copy_is_owed(first):
    refs, sched = _hedged_head()
    other = "b:1" if first == "a:1" else "a:1"
    assert not sched.declined(first, refs[0], requeue=False), "the other copy may yet come"
    assert sched.arrived(other, refs[0], 10, 6.0), "the other copy is used"
    assert not sched.declined(first, refs[0], requeue=False) and not sched.arrived(first, refs[0], 10, 6.0)


def test_a_hedged_batch_is_an_error_once_no_server_owes_it_any_more():
    refs, sched = _hedged_head()
    assert not sched.declined("b:1", refs[0], requeue=False)
    assert sched.declined("a:1", refs[0], requeue=False), "the last copy failed: the consumer is told"
    assert not sched.lanes.owes("b:1") and refs[0] not in list(sched.todo)
    refs, sched = _hedged_head()  # both shutting down: asked again once no copy is owed
    assert not sched.declined("a:1", refs[0], requeue=True) and [r.index for r in sched.todo] == []
    assert sched.declined("b:1", refs[0], requeue=True) and [r.index for r in sched.todo] == [0]


def _affinity(num_samples=4096, batch=8, block=64):
    return Affinity(pb.DatasetInfo(num_samples=num_samples, batch_size=batch, drop_last=True, shuffle=True,
                                   block_samples=block, interleave=1, fingerprint="fp"))


def test_with_affinity_each_block_goes_to_its_owner_weighted_by_workers():
    aff = _affinity()
    big, small = FakeServer("big:1", 0.01, workers=3), FakeServer("small:1", 0.01, workers=1)
    n = 4096 // 8
    refs = [BatchId(1, 0, i) for i in range(n)]
    sched = Scheduler(refs, affinity=aff)
    asked: dict[int, set[str]] = collections.defaultdict(set)
    real = {s.address: s.ask for s in (big, small)}
    for s in (big, small):
        s.ask = (lambda refs_, now, _s=s: ([asked[aff.block(r)].add(_s.address) for r in refs_],
                                           real[_s.address](refs_, now)))
    _, sched, out = simulate([big, small], n, window=6, sched=sched)
    assert out.finished
    assert all(len(v) == 1 for v in asked.values()), "a block is built by one server"
    share = sum(1 for v in asked.values() if "big:1" in v) / len(asked)
    assert 0.6 < share < 0.9, share


def test_hints_announce_each_block_once_to_its_owner():
    aff = _affinity()
    refs = [BatchId(1, 0, i) for i in range(4096 // 8)]
    sched = Scheduler(refs, affinity=aff)
    for a in ("a:1", "b:1"):
        sched.lanes.lane(a, 4)
    hinted = []
    for t in range(200):
        orders = sched.plan(min(t * 2, len(refs) - 1), ["a:1", "b:1"], ("a:1", "b:1"), t * 0.01)
        for address, rs in orders.hint.items():
            hinted += [(aff.block(r), address, r) for r in rs]
        for address, rs in orders.fetch.items():
            for r in rs:
                sched.arrived(address, r, 10, t * 0.01)
    blocks = [b for b, _, _ in hinted]
    assert blocks and len(blocks) == len(set(blocks)), "each block is announced once"
    assert all(a == aff.owner(r, ("a:1", "b:1")) for _, a, r in hinted)


def test_a_group_cut_short_by_the_bound_ahead_waits_to_be_half_a_window():
    """The consumer lags (it has taken nothing yet): the bound ahead would let one more batch go,
    and a request of one batch costs the server a wake-up of its own; it waits for the consumer."""
    refs = [BatchId(1, 0, i) for i in range(20)]
    sched = Scheduler(refs)
    sched.lanes.lane("a:1", 4)
    frames = []

    def turn(nxt, now, arrive=()):
        for i in arrive:
            assert sched.arrived("a:1", refs[i], 1 << 21, now)
        sent = sched.plan(nxt, ["a:1"], (), now).fetch.get("a:1", [])
        if sent:
            frames.append([r.index for r in sent])

    turn(0, 0.0)
    turn(0, 0.1, arrive=(0, 1, 2))
    turn(0, 0.2, arrive=(3, 4, 5))  # only batch 7 lies within the bound (8 places ahead of 0)
    assert frames == [[0, 1, 2, 3], [4, 5, 6]]
    turn(6, 0.3)  # the consumer took batches 0-5
    assert frames[-1] == [7, 8, 9]


def test_the_fetcher_goes_on_while_a_failed_hedged_copy_s_twin_is_owed():
    """The fetcher's handling of a server's error frame, with the scheduler of a hedged batch: the
    first copy's failure neither raises nor drops the batch; the other copy is handed out; a
    failure of the last copy owed raises, naming the batch."""
    from types import SimpleNamespace

    from data_service.errors import BatchBuildError
    from dnn_worker.fetch.attempts import Attempts
    from dnn_worker.fetch.fetcher import Fetcher

    def handle(sched, address, ev_kind, ref, out, kind=pb.TRANSFORM_FAILED):
        drained = []
        fetcher = SimpleNamespace(_scheduler=sched, _set=SimpleNamespace(drain=lambda a, why: drained.append(a)),
                                  _attempts=Attempts(3))
        server = SimpleNamespace(address=address, conn="conn")
        ev = SimpleNamespace(kind=ev_kind, conn="conn", batch_id=ref, batch=f"batch {ref.index}", nbytes=10,
                             error=pb.BatchError(ref=ref.ref(), kind=kind, message="decode failed"))
        Fetcher._handle(fetcher, server, ev, out)
        return drained

    refs, sched = _hedged_head()
    out = InOrderBuffer(len(refs))
    handle(sched, "a:1", "error", refs[0], out)  # no raise: "b:1" still owes it
    handle(sched, "b:1", "batch", refs[0], out)
    assert list(out.ready()) == [(0, "batch 0")]
    refs, sched = _hedged_head()
    assert handle(sched, "b:1", "error", refs[0], out, kind=pb.SHUTTING_DOWN) == ["b:1"], "drained all the same"
    with pytest.raises(BatchBuildError, match="decode failed"):
        handle(sched, "a:1", "error", refs[0], InOrderBuffer(len(refs)))
