"""The worker pool's waiting tasks and which one a worker gets next, stuck batches moved aside.

Tasks wait in the order they came; a worker with a free slot gets the oldest one not cancelled.

Stuck batches: a consumer that stops taking its batches but stays connected (a training loop
paused for evaluation, an iterator broken off and not closed) would keep every slot it was
built into, and no other consumer would get a batch until its send timeout. So when a worker
has no free slot, another consumer is waiting, and a slot's batch has waited ``STUCK_S``, the
slot is detached (slots.py): the batch stays where it is for its consumer, the worker builds
into a fresh region, and the consumers whose batches are not stuck go first. At most
``detach_per_owner`` batches per consumer connection are detached at once: a consumer's default
window, so every batch a consumer asked for can be moved aside, which bounds the memory a
stalled consumer can pin to what it asked for. There is no cap over all connections together:
DDP ranks in lock step that got ahead hold their windows while they wait for the rank behind,
and that rank must still get the worker, or the whole job waits forever.

The queue holds no lock: its owner (the pool's state, state.py) calls it under its own lock.
"""
from __future__ import annotations

import collections
import time
from typing import Iterable

from .slots import ServerSlot, SlotTable
from .tasks import Task

STUCK_S = 0.25    # a built batch nobody took for this long may be moved out of its worker's way
DETACH_PER_OWNER = 8  # detached batches one consumer connection may hold at once, at least (see detach_per_owner)


class TaskQueue:
    """The tasks no worker has yet, and the slots detached for them; see the module docstring."""

    def __init__(self, num_workers: int) -> None:
        self._pending: collections.deque[Task] = collections.deque()
        # A consumer's default window is max(4, 2 x workers), 8 while batches are small
        # (dnn_worker/fetch/fetch_options.py): that many of its batches may be moved aside.
        self.detach_per_owner = max(DETACH_PER_OWNER, 2 * num_workers)
        self._detached: set[ServerSlot] = set()  # slots detached from their worker, not yet released

    def __len__(self) -> int:
        return len(self._pending)

    def append(self, task: Task) -> None:
        """A new task, last in line."""
        self._pending.append(task)

    def appendleft(self, task: Task) -> None:
        """A task to build again, first in line."""
        self._pending.appendleft(task)

    def extendleft(self, tasks: Iterable[Task]) -> None:
        """Tasks to build again, first in line, the last of ``tasks`` first."""
        self._pending.extendleft(tasks)

    def drain(self) -> list[Task]:
        """Every waiting task, oldest first; the queue is empty after."""
        pending = list(self._pending)
        self._pending.clear()
        return pending

    def next_for(self, table: SlotTable) -> tuple[Task, tuple[int, bool]] | None:
        """The task the worker with slot table ``table`` builds next, and the slot it builds into
        (``SlotTable.reserve``); None when no task waits or the worker has no slot to give."""
        while self._pending and self._pending[0].cancelled:
            self._pending.popleft()
        if not self._pending:
            return None
        free = table.reserve()
        return (self._take(), free) if free is not None else self._make_room(table)

    def _take(self) -> Task:
        """The next task (the head is not cancelled): the oldest one, except that consumers with
        stuck batches wait behind those without."""
        if self._detached:
            stuck = {s.owner for s in self._detached}
            for i, t in enumerate(self._pending):
                if not t.cancelled and t.owner not in stuck:
                    del self._pending[i]
                    return t
        return self._pending.popleft()

    def _make_room(self, table: SlotTable) -> tuple[Task, tuple[int, bool]] | None:
        """The worker of ``table`` has no free slot: detach its oldest stuck batch for which a task
        of another consumer is waiting; returns that task and the freed slot (module docstring)."""
        cap = self.detach_per_owner
        for slot in table.stuck(time.monotonic() - STUCK_S):
            if sum(s.owner is slot.owner for s in self._detached) >= cap:
                continue
            for i, t in enumerate(self._pending):
                if not t.cancelled and t.owner is not slot.owner:
                    table.detach(slot)
                    self._detached.add(slot)
                    free = table.reserve()
                    if free is None:  # cannot happen: detaching frees a slot
                        return None
                    del self._pending[i]
                    return t, free
            # Every waiting task is this slot's consumer's own (it holds a batch that came early
            # while it waits for an earlier one): a younger slot of another consumer may free it.
        return None

    def detached_slots(self) -> list[ServerSlot]:
        """The slots detached from their worker whose batch is not yet released."""
        return list(self._detached)

    def forget(self, slot: ServerSlot) -> None:
        """The batch in ``slot`` was released or retired: if it was detached, it no longer is."""
        self._detached.discard(slot)
