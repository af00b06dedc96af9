"""The batch window and the shared builds around it, as properties over generated request streams.

``BatchWindow`` (data_service/server/batch_window.py): whatever is put, got, pinned and unpinned,
the bytes held never exceed the budget, every byte held is accounted for, and a lookup returns
the batch of its key or nothing. ``SharedBuilds`` (shared_builds.py) over a builder that makes
each batch's bytes from its identity and finishes builds in any order: every request is answered
once with its own batch's bytes (never another's, never skipped), a cancelled one never, and once
every send has ended the window holds exactly its indexed batches.
"""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_service.contract.batch_id import BatchId
from data_service.errors import ConfigError
from data_service.pool.tasks import Result, Task
from data_service.server.batch_window import BatchKey, BatchWindow, window_budget
from data_service.server.build_ahead import AheadPlan
from data_service.server.build_record import BuildRecord
from data_service.server.options import ServerOptions
from data_service.server.shared_builds import BatchIdentity, SharedBuilds

FAST = settings(max_examples=300, deadline=None)
IDENTITY = BatchIdentity("fp", "", "")


def payload(key: BatchKey) -> bytes:
    """A batch's bytes, a function of its identity alone (as a pipeline's are); sizes 1..64."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return digest * 2 if key.batch.index % 2 else digest[: 1 + key.batch.index % 31]


def key_of(seed: int, epoch: int, index: int) -> BatchKey:
    return IDENTITY.key(BatchId(seed, epoch, index))


def header(key: BatchKey) -> bytes:
    b = key.batch
    return f"{b.seed}/{b.epoch}/{b.index}".encode()


keys = st.builds(key_of, st.integers(0, 2), st.integers(0, 1), st.integers(0, 9))


def check_accounting(window: BatchWindow, live: list) -> None:
    """Bytes held are exactly the indexed entries plus evicted ones still pinned, within budget."""
    indexed = {e.key: e for e in window._index.values()}
    pinned_out = {id(e): e for e in live if e.pins and not e.indexed}
    held = sum(e.size for e in indexed.values()) + sum(e.size for e in pinned_out.values())
    assert window.held_bytes == held <= window.budget
    assert window.pinned_bytes == sum(e.size for e in {**{id(e): e for e in indexed.values()}, **pinned_out}.values()
                                      if e.pins)


@FAST
@given(budget=st.integers(1, 400), ops=st.lists(st.tuples(st.sampled_from("pgu"), keys), max_size=120))
def test_the_window_stays_within_budget_and_returns_only_its_keys_batch(budget, ops):
    window = BatchWindow(budget)
    live: list = []  # every entry handed out, for the accounting
    pins: list = []  # one element per pin we hold
    for op, key in ops:
        if op == "p":
            entry = window.put(key, header(key), payload(key))
            if entry is None:
                assert len(header(key)) + len(payload(key)) + window.pinned_bytes > budget
            else:
                live.append(entry)
                pins.append(entry)
        elif op == "g":
            entry = window.get(key)
            if entry is not None:
                pins.append(entry)
        elif pins:
            window.unpin(pins.pop(key.batch.index % len(pins)))
        if op in "pg" and entry is not None:
            assert entry.key == key and entry.header == header(key) and entry.data == payload(key)
        check_accounting(window, live)
    while pins:
        window.unpin(pins.pop())
    check_accounting(window, live)
    assert window.pinned_bytes == 0
    assert window.held_bytes == sum(e.size for e in window._index.values())


def test_an_unpinned_entry_makes_room_and_a_pinned_one_is_kept():
    window = BatchWindow(100)
    a = window.put(key_of(0, 0, 0), b"h", b"x" * 49)
    window.unpin(a)
    b = window.put(key_of(0, 0, 1), b"h", b"y" * 49)  # pinned: a send of it is under way
    c = window.put(key_of(0, 0, 2), b"h", b"z" * 49)
    assert c is not None and key_of(0, 0, 0) not in window and key_of(0, 0, 1) in window
    assert window.put(key_of(0, 0, 3), b"h", b"w" * 49) is None  # b and c pinned: no room, nothing evicted
    assert window.refused == 1 and len(window) == 2
    window.unpin(b)
    window.unpin(c)
    assert window.put(key_of(0, 0, 3), b"h", b"w" * 49) is not None
    assert window.held_bytes <= 100


def test_a_batch_larger_than_the_budget_is_refused():
    window = BatchWindow(10)
    assert window.put(key_of(0, 0, 0), b"h", b"x" * 10) is None
    assert window.held_bytes == 0 and window.refused == 1


class Builder:
    """Builds as a worker pool would, in the order the test says: a batch's bytes from its identity."""

    def __init__(self) -> None:
        self.pending: list[Task] = []
        self.cancelled: list[Task] = []
        self.failed = 0

    def submit(self, task: Task) -> None:
        self.pending.append(task)

    def cancel(self, tasks: list[Task]) -> None:
        for t in tasks:
            t.cancelled = True
            self.cancelled.append(t)
        self.pending = [t for t in self.pending if not t.cancelled]

    def finish(self, k: int, error: bool = False) -> None:
        task = self.pending.pop(k % len(self.pending))
        key = IDENTITY.key(task.batch)
        if error:
            from data_service.protocol.generated import pb

            self.failed += 1
            task.on_result(Result(task=task, error=pb.BatchError(kind=pb.TRANSFORM_FAILED, message="boom")))
            return
        data = bytearray(payload(key))
        slot = {"free": False}
        task.on_result(Result(task=task, header_bytes=header(key), payload=memoryview(data),
                              payload_bytes=len(data), raw_bytes=len(data),
                              _release=lambda: slot.update(free=True), _retire=lambda: slot.update(free=True)))


ops = st.lists(st.one_of(
    st.tuples(st.just("ask"), st.integers(0, 3), keys),         # consumer c asks for a batch
    st.tuples(st.just("build"), st.integers(0, 50), st.booleans()),  # a build finishes (or fails)
    st.tuples(st.just("send"), st.integers(0, 50), st.none()),   # a delivered batch is sent: released
    st.tuples(st.just("drop"), st.integers(0, 3), st.none()),    # consumer c's connection ends
), max_size=150)


@FAST
@given(budget=st.integers(1, 500), script=ops, workers=st.integers(1, 3), lead=st.integers(0, 4))
def test_every_request_gets_its_own_batch_once_and_the_window_stays_within_budget(budget, script, workers, lead):
    builder = Builder()
    shared = SharedBuilds(builder, BatchWindow(budget), IDENTITY, num_batches=10, workers=workers, lead=lead)
    answers: dict[int, list[Result]] = {}
    bytes_of: dict[int, bytes] = {}
    asked: dict[int, tuple[int, Task]] = {}
    dropped: set[int] = set()
    unsent: list[Result] = []

    def answer(result: Result) -> None:
        answers.setdefault(id(result.task), []).append(result)
        if result.error is None:
            bytes_of[id(result.task)] = bytes(result.payload)  # what the session sends
            unsent.append(result)

    for op, a, b in script:
        if op == "ask":
            task = Task(b.batch, answer, owner=a)
            asked[id(task)] = (a, task)
            shared.submit(task)
        elif op == "build" and builder.pending:
            builder.finish(a, error=b and a % 5 == 0)
        elif op == "send" and unsent:
            unsent.pop(a % len(unsent)).release()
        elif op == "drop":
            mine = [t for c, t in asked.values() if c == a and id(t) not in dropped and id(t) not in answers]
            dropped.update(id(t) for t in mine)
            shared.cancel(mine)
        assert shared.window.held_bytes <= budget
    while builder.pending:
        builder.finish(0)
    while unsent:
        unsent.pop().release()
    for tid, (_, task) in asked.items():
        got = answers.get(tid, [])
        if tid in dropped:
            assert not got
            continue
        assert len(got) == 1, f"request {task.batch} answered {len(got)} times"
        result = got[0]
        assert result.task is task
        if result.error is None:
            key = IDENTITY.key(task.batch)
            assert result.header_bytes == header(key) and bytes_of[tid] == payload(key)
    window = shared.window
    assert window.pinned_bytes == 0 and window.held_bytes == sum(e.size for e in window._index.values()) <= budget
    counts = shared.counts
    assert counts.hits + counts.joined + counts.misses == len(asked)
    assert counts.built == counts.misses + counts.ahead - len(builder.cancelled) - builder.failed


def test_a_batch_sent_from_the_window_is_its_own_bytes():
    builder = Builder()
    shared = SharedBuilds(builder, BatchWindow(1000), IDENTITY, num_batches=10)
    seen = []
    first = Task(BatchId(1, 0, 3), lambda r: seen.append(bytes(r.payload)))
    shared.submit(first)
    builder.finish(0)
    shared.submit(Task(BatchId(1, 0, 3), lambda r: seen.append(bytes(r.payload))))  # a hit
    shared.submit(Task(BatchId(2, 0, 3), lambda r: seen.append(bytes(r.payload))))  # another seed: built for it
    assert shared.counts.hits == 1 and shared.counts.misses == 2 and len(builder.pending) == 1
    builder.finish(0)
    assert seen == [payload(key_of(1, 0, 3))] * 2 + [payload(key_of(2, 0, 3))]


def test_a_batch_built_after_it_left_the_window_counts_as_built_again():
    builder = Builder()
    shared = SharedBuilds(builder, BatchWindow(80), IDENTITY, num_batches=10)
    for index in (1, 3, 1):  # odd indices: 64-byte payloads, one fits at a time
        shared.submit(Task(BatchId(0, 0, index), lambda r: r.release()))
        builder.finish(0)
    assert shared.counts.built == 3 and shared.counts.built_again == 1
    assert shared.figures().built_again == 1


def test_idle_workers_build_the_next_epochs_first_batches_which_the_jobs_then_find_in_the_window():
    builder = Builder()
    shared = SharedBuilds(builder, BatchWindow(10_000), IDENTITY, num_batches=10, workers=2, lead=3)
    got: list[bytes] = []

    def take(result: Result) -> None:
        got.append(bytes(result.payload))
        result.release()

    for index in range(7):  # far from the epoch's end: nothing ahead
        shared.submit(Task(BatchId(1, 0, index), take))
        builder.finish(0)
    assert shared.counts.ahead == 0
    shared.submit(Task(BatchId(1, 0, 7), take))  # among the last 3: one worker builds it, the other is idle
    assert [(t.batch.epoch, t.batch.index) for t in builder.pending] == [(0, 7), (1, 0)]
    shared.submit(Task(BatchId(1, 0, 8), take))
    shared.submit(Task(BatchId(1, 0, 9), take))
    assert len(builder.pending) == 4  # both requests wait in line: nothing more ahead while workers are busy
    while builder.pending:
        builder.finish(0)
    assert shared.counts.ahead == 3 and key_of(1, 1, 2) in shared.window and key_of(1, 1, 3) not in shared.window
    for index in range(3):
        shared.submit(Task(BatchId(1, 1, index), take))
    assert shared.counts.hits == 3 and shared.counts.ahead_used == 3 and not builder.pending
    assert got[-3:] == [payload(key_of(1, 1, i)) for i in range(3)]
    figures = shared.figures()
    assert figures.built_ahead == 3 and figures.ahead_used == 3


def test_a_build_ahead_that_a_job_asks_for_is_joined_and_without_a_window_lead_nothing_is_built_ahead():
    builder = Builder()
    shared = SharedBuilds(builder, BatchWindow(10_000), IDENTITY, num_batches=4, workers=2, lead=2)
    seen: list[bytes] = []
    shared.submit(Task(BatchId(5, 0, 3), lambda r: seen.append(bytes(r.payload))))
    assert [(t.batch.epoch, t.batch.index) for t in builder.pending] == [(0, 3), (1, 0)]
    shared.submit(Task(BatchId(5, 1, 0), lambda r: seen.append(bytes(r.payload))))  # asked while built ahead: joined
    shared.cancel([])  # nothing to cancel
    builder.finish(1)
    assert shared.counts.joined == 1 and shared.counts.ahead_used == 1 and seen == [payload(key_of(5, 1, 0))]
    off = SharedBuilds(Builder(), BatchWindow(10_000), IDENTITY, num_batches=4, workers=2, lead=0)
    off.submit(Task(BatchId(5, 0, 3), lambda r: None))
    assert off.counts.ahead == 0 and len(off._pool.pending) == 1


@settings(max_examples=200, deadline=None)
@given(num_batches=st.integers(0, 12), lead=st.integers(0, 6),
       asks=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 11)), max_size=40))
def test_the_ahead_plan_names_only_the_next_epochs_first_batches_once_each(num_batches, lead, asks):
    plan = AheadPlan(num_batches, lead)
    front: dict[int, tuple[int, int]] = {}
    started: set[BatchId] = set()
    for seed, epoch, index in asks:
        if index >= num_batches:
            continue
        plan.asked(BatchId(seed, epoch, index))
        if plan.lead:
            front[seed] = max(front.get(seed, (epoch, index)), (epoch, index))
        for due in plan.due():
            fe, fi = front[due.seed]
            assert due.epoch == fe + 1 and 0 <= due.index < min(lead, num_batches) and fi >= num_batches - plan.lead
            assert due not in started
            started.add(due)
            plan.started(due)
    assert plan.lead == min(lead, num_batches)


def test_build_ahead_is_checked():
    with pytest.raises(ConfigError, match=r"build_ahead=-1 must be an integer >= 0 \(batches"):
        ServerOptions(build_ahead=-1)
    assert ServerOptions(build_ahead=0).build_ahead == 0


def test_the_build_record_forgets_the_oldest_epochs():
    record = BuildRecord(num_batches=4, epochs_kept=2)
    assert not record.built(BatchId(0, 0, 1)) and record.built(BatchId(0, 0, 1))
    record.built(BatchId(0, 1, 0))
    record.built(BatchId(0, 2, 0))  # (0, 0) forgotten
    assert not record.built(BatchId(0, 0, 1))


@pytest.mark.parametrize("value, expected", [("2GB", 2 * 10**9), ("512MiB", 512 << 20), (0, 0), ("1000", 1000)])
def test_window_sizes_parse(value, expected):
    assert window_budget(value) == expected


@pytest.mark.parametrize("value", ["lots", "-1GB", -5])
def test_a_bad_window_size_names_the_value_and_the_form(value):
    with pytest.raises(ConfigError, match="batch_window=.*2GB"):
        window_budget(value)


def test_server_options_refuse_a_negative_window():
    with pytest.raises(ConfigError, match=r"batch_window_bytes=-1 must be .*--batch-window"):
        ServerOptions(batch_window_bytes=-1)


def test_a_consumer_keeps_only_a_batch_it_asked_for_by_its_identity():
    """The consumer's side of "never another job's batch": a batch whose (seed, epoch, index) it
    did not ask of that server is dropped, whatever its bytes."""
    from dnn_worker.fetch.scheduler import Scheduler

    mine = [BatchId(1, 0, i) for i in range(4)]
    sched = Scheduler(mine)
    sched.lanes.lane("a:1", window=4)
    orders = sched.plan(0, ["a:1"], ("a:1",), 0.0)
    assert [r.index for r in orders.fetch["a:1"]] == [0, 1, 2, 3]
    for other in (BatchId(2, 0, 0), BatchId(1, 1, 0), BatchId(1, 0, 9)):
        assert not sched.arrived("a:1", other, 10, 0.1)  # another seed's, epoch's or index's batch
    assert not sched.arrived("b:1", mine[0], 10, 0.1)  # not asked of that server
    assert sched.arrived("a:1", mine[0], 10, 0.1) and not sched.arrived("a:1", mine[0], 10, 0.2)  # once
