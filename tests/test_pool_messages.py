"""Messages on the pipe between the worker pool and its worker processes (pool/messages.py)."""
from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest

from data_service.contract.batch_id import BatchId
from data_service.pool import messages as pm
from data_service.pool.fork_safety import Hazards

MESSAGES = [
    pm.TaskMsg(1, BatchId(2**64 - 1, 3, 4), 5, True),
    pm.DoneMsg(7, 1, ("/proc/1/fd/3", 1 << 20), b"\x0a\x02\x08\x01" * 50, 10, 20, 0.5, 0.25, 3),
    pm.DoneMsg(8, 2, None, b"", 0, 0, 0.0, 0.0, 0),
    pm.ErrorMsg(9, 1, "ValueError: bad sample", "Traceback ...\n" * 20_000, 17),
    pm.ReadyMsg(1234),
    pm.ReadyMsg(1234, None, ("torchvision", "torchvision.io"), Hazards(("worker-pool",), True, 2)),
    pm.ImportedMsg(("PIL.Image",), Hazards()),
    pm.PromoteMsg(3),
    pm.FatalMsg("ImportError: no module", "Traceback ..."),
    pm.StopMsg(),
]


@pytest.fixture
def pipe():
    a, b = mp.get_context("spawn").Pipe(duplex=True)
    a, b = pm.message_connection(a), pm.message_connection(b)
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_comes_back_equal(msg):
    assert pm.decode(pm.encode(msg)) == msg


def test_messages_read_together_come_out_one_by_one_and_are_seen_as_waiting(pipe):
    # One read takes every message the pipe holds; the ones after the first wait in the
    # connection, where no selector sees them, so pending()/poll() must say so.
    a, b = pipe
    for msg in MESSAGES[:3]:
        a.send(msg)
    time.sleep(0.1)
    assert b.recv() == MESSAGES[0]
    assert b.pending() and b.poll(0)
    assert b.recv() == MESSAGES[1]
    assert b.recv() == MESSAGES[2]
    assert not b.pending() and not b.poll(0)


def test_a_message_larger_than_one_read_arrives_whole(pipe):
    a, b = pipe
    big = MESSAGES[3]  # a traceback of about 300 KB: more than the pipe holds, so it is sent meanwhile
    sender = threading.Thread(target=a.send, args=(big,), daemon=True)
    sender.start()
    assert b.recv() == big
    sender.join(10)


def test_the_other_end_closing_is_eof(pipe):
    a, b = pipe
    a.send(MESSAGES[0])
    a.close()
    assert b.recv() == MESSAGES[0]
    with pytest.raises(EOFError):
        b.recv()


def test_an_unknown_tag_is_refused():
    with pytest.raises(ValueError, match="unknown worker pipe message tag"):
        pm.decode(b"Zxxxx")


def test_tasks_given_to_a_worker_at_once_go_in_one_write(pipe):
    # Every write to the worker's pipe wakes it once: tasks assigned together go in one.
    from data_service.pool.slots import SlotTable
    from data_service.pool.tasks import Task
    from data_service.pool.lifecycle import WorkerHandle
    from data_service.pool.worker_pool import TASKS_AHEAD, WorkerPool

    a, b = pipe
    writes: list[bytes] = []
    real = a.send_frames
    a.send_frames = lambda frames: writes.append(bytes(frames)) or real(frames)
    pool = WorkerPool("{}", 1, slots_per_worker=4)
    pool.state.workers_spawned([WorkerHandle(0, None, a, SlotTable(4), ready=True)])
    for i in range(3):
        pool.state.submit(Task(BatchId(5, 0, i), lambda _: None))  # queued, given to no worker yet: ids 1, 2, 3
    pool._assign()
    assert len(writes) == 1, f"{TASKS_AHEAD} tasks took {len(writes)} writes"
    got = [b.recv() for _ in range(TASKS_AHEAD)]
    assert [(m.task_id, m.batch.index) for m in got] == [(i + 1, i) for i in range(TASKS_AHEAD)]
    assert not b.poll(0.1)
