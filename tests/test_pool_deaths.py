"""Which batch a dead worker is blamed for (the pool's state, no process): the first it had not
reported built. A batch it reported into a region the server could not open yet did not kill it."""
from __future__ import annotations

from data_service.contract.batch_id import BatchId
from data_service.pool.lifecycle import WorkerConfig, unstarted
from data_service.pool.state import MAX_ATTEMPTS, PoolState
from data_service.pool.tasks import Task


def _pool_with_tasks(n: int):
    state = PoolState(1)
    w = unstarted(0, WorkerConfig("{}", num_slots=2, start_timeout=1.0, log_level=0, compression=""))
    state.workers_spawned([w])
    state.workers_ready()
    tasks = [Task(BatchId(5, 0, i), on_result=lambda r: None) for i in range(n)]
    for t in tasks:
        assert state.submit(t) == []
    state.assign()
    return state, w, tasks


def test_a_dead_worker_is_blamed_for_the_first_batch_it_had_not_reported():
    state, w, tasks = _pool_with_tasks(2)
    assert [t for t, _ in w.tasks.values()] == tasks
    death = state.worker_died(w)
    assert death.building is tasks[0] and tasks[0].attempts == 1 and tasks[1].attempts == 0


def test_a_batch_reported_into_a_region_not_yet_opened_is_not_what_killed_its_worker():
    state, w, tasks = _pool_with_tasks(2)
    state.region_reported(w, tasks[0].id)  # the worker died before the server opened batch 0's region
    death = state.worker_died(w)
    assert death.building is tasks[1] and tasks[1].attempts == 1 and tasks[0].attempts == 0
    # both wait to be built again; the late decision on batch 0's region finds it taken care of
    assert state.queue_depth == 2
    assert state.region_unmappable(w, tasks[0].id, True, "gone") == (None, []) and state.queue_depth == 2


def test_a_batch_that_killed_too_many_workers_fails_and_the_ones_behind_it_are_built_again():
    state, w, tasks = _pool_with_tasks(2)
    tasks[1].attempts = MAX_ATTEMPTS - 1
    state.region_reported(w, tasks[0].id)
    death = state.worker_died(w)
    assert death.crashed == [tasks[1]]
    assert state.queue_depth == 1  # batch 0 waits to be built again; batch 1 fails
