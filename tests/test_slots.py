"""The slot table on its own: reserve, fill, lease, release, retire, renew (no worker process)."""
from __future__ import annotations

import os

import pytest

from data_service.pool.slots import ServerSlot, SlotTable


@pytest.fixture
def region():
    """A memfd in this process, reachable as /proc/self/fd/<n> like a worker's slot."""
    fds = []

    def make(capacity: int = 4096) -> tuple[str, int]:
        fd = os.memfd_create("test-slot", 0)
        os.ftruncate(fd, capacity)
        fds.append(fd)
        return f"/proc/{os.getpid()}/fd/{fd}", capacity

    yield make
    for fd in fds:
        os.close(fd)


def fill_new(table: SlotTable, region, used: int = 100) -> ServerSlot:
    k, renew = table.reserve()
    return table.fill(k, ServerSlot(*region(), table=table), used)


def test_reserve_hands_out_each_free_slot_once():
    table = SlotTable(3)
    got = [table.reserve() for _ in range(4)]
    assert got == [(0, False), (1, False), (2, False), None]
    table.unreserve(1)
    assert table.reserve() == (1, False)


def test_a_filled_slot_is_not_free_until_released(region):
    table = SlotTable(1)
    slot = fill_new(table, region, used=123)
    assert slot.in_use and slot.used_bytes == 123 and table.in_use() == [slot]
    assert table.reserve() is None
    table.release(slot)
    assert table.in_use() == [] and table.reserve() == (0, False)


def test_the_region_is_reachable_through_the_servers_own_descriptor(region):
    table = SlotTable(1)
    slot = fill_new(table, region)
    slot.map[:5] = b"hello"
    with open(slot.path, "rb") as f:
        assert f.read(5) == b"hello"
    assert os.fstat(slot.fd).st_ino == slot.inode
    slot.close()


def test_leases_always_leave_one_slot_without_a_lease(region):
    table = SlotTable(3)
    slots = [fill_new(table, region) for _ in range(3)]
    assert [table.lease(s) for s in slots] == [True, True, False]
    assert table.lease(slots[0]) is None  # already leased
    table.release(slots[0])
    assert table.leased == 1 and table.lease(slots[2]) is True


def test_a_retired_slot_is_never_reused_and_its_next_batch_gets_a_fresh_region(region):
    table = SlotTable(1)
    slot = fill_new(table, region)
    table.lease(slot)
    table.retire(slot)
    assert slot.orphan and slot.fd == -1 and table.leased == 0
    assert table.slots == [None]
    assert table.reserve() == (0, True)  # renew: the worker builds into a new region
    assert table.fill(0, None, 10) is None  # no region known for it: the batch is built again
    assert table.reserve() == (0, True)


def test_a_region_that_could_not_be_opened_is_renewed():
    table = SlotTable(2)
    k, _ = table.reserve()
    table.unreserve(k, renew=True)
    assert table.reserve() == (k, True)


def test_a_dead_workers_free_slots_close_at_once_and_busy_ones_on_release(region):
    table = SlotTable(2)
    busy = fill_new(table, region)
    free = fill_new(table, region)
    table.release(free)
    table.orphan_all()
    assert free.fd == -1 and busy.fd >= 0
    assert table.lease(busy) is False  # an orphan is never leased
    table.release(busy)
    assert busy.fd == -1


def test_a_new_region_replaces_and_closes_the_old_one(region):
    table = SlotTable(1)
    old = fill_new(table, region)
    table.release(old)
    new = fill_new(table, region)
    assert old.fd == -1 and new is not old and table.slots == [new]


def test_a_detached_slot_stays_readable_until_released_and_the_worker_gets_a_fresh_region(region):
    table = SlotTable(1)
    slot = fill_new(table, region)
    slot.map[:5] = b"stuck"
    assert table.lease(slot) is False  # one slot: no lease
    table.detach(slot)
    assert table.reserve() == (0, True)  # free again, into a new region
    with open(slot.path, "rb") as f:  # its consumer can still read it
        assert f.read(5) == b"stuck"
    assert table.lease(slot) is False and slot.in_use
    table.release(slot)
    assert slot.fd == -1  # closed once released


def test_detaching_a_leased_slot_gives_its_lease_back(region):
    table = SlotTable(2)
    a = fill_new(table, region)
    assert table.lease(a) is True and table.leased == 1
    table.detach(a)
    assert table.leased == 0
    b = fill_new(table, region)
    assert table.lease(b) is True  # the lease counter was not left behind
    table.release(a)
    assert table.leased == 1


def test_stuck_lists_batches_built_before_a_time_oldest_first(region):
    table = SlotTable(3)
    a, b, c = (fill_new(table, region) for _ in range(3))
    a.filled_at, b.filled_at, c.filled_at = 10.0, 5.0, 30.0
    assert table.stuck(older_than=20.0) == [b, a]
    table.release(b)
    assert table.stuck(older_than=20.0) == [a]
