"""The loop that polls a pool never waits on a process: a worker dying, its exit status late, stalls it
for no more than a turn."""
from __future__ import annotations

import os
import select
import signal
import time
from multiprocessing.connection import wait as mp_wait

import pytest

from data_service.contract.batch_id import BatchId
from data_service.contract.pipeline import PipelineSpec
from data_service.pool import worker_pool as workers
from data_service.pool.forked import CODE_WAIT_S

STALL_S = 0.05  # the longest one turn of the loop may take while a worker dies


def _drive(pool: workers.WorkerPool, seconds: float, until=lambda: False) -> float:
    """Poll ``pool`` as the data plane's loop does for up to ``seconds``; the longest turn."""
    longest, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end and not until():
        ready = mp_wait(pool.wait_objects(), timeout=0.01)
        start = time.monotonic()
        pool.handle_ready(ready)
        pool.tick()
        longest = max(longest, time.monotonic() - start)
    return longest


@pytest.mark.slow
def test_a_dying_worker_whose_exit_status_is_late_stalls_the_loop_for_no_more_than_a_turn():
    spec = PipelineSpec("examples.synthetic:build_pipeline", {"size": 64, "batch_size": 4})
    pool = workers.WorkerPool(spec.to_json(), 1, slots_per_worker=2, worker_start="warm", spare=False)
    pool.start(own_thread=False)
    parent = pool.starter.parent
    if pool.starter.method != "warm" or parent is None:
        pytest.skip("the data workers were spawned here: no warm parent to hold the exit status back")
    try:
        done: list = []
        for i in range(4):
            pool.submit(workers.Task(BatchId(0, 0, i), done.append))
        _drive(pool, 30, until=lambda: len(done) == 4)
        for r in done:
            r.release()
        victim = pool.worker_pids()[0]
        # The warm parent reaps its workers and writes each exit status: stopped, it writes none for
        # CODE_WAIT_S, which a loop that waits for the status would sit out.
        os.kill(parent.process.pid, signal.SIGSTOP)
        try:
            first = pool.state.workers()[0]
            os.kill(victim, signal.SIGKILL)
            # gone before the loop looks (its pidfd readable), as when the loop is busy elsewhere
            assert select.select([first.process.sentinel], [], [], 10)[0], "the killed worker did not end"
            longest = max(_drive(pool, 10 * CODE_WAIT_S, until=lambda: not first.alive), _drive(pool, 0.3))
            assert not first.alive, "the pool did not notice its worker's death"
        finally:
            os.kill(parent.process.pid, signal.SIGCONT)
        assert longest < STALL_S, f"a turn of the loop took {longest * 1000:.0f} ms while a worker died"
    finally:
        pool.stop(2.0)
