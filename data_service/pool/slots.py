"""The server's table of one data worker's output slots: reserve, fill, lease, release, retire.

A worker builds each batch into one of its ``num_slots`` shared-memory regions (anonymous
memfds, see process.py). The server opens each region through
``/proc/<worker pid>/fd/<n>`` and keeps its own descriptor, so the region stays reachable at
``/proc/<server pid>/fd/<fd>`` for consumers on this host even when the worker dies.

A slot's life: ``reserve`` (a task is sent to build into it) -> ``fill`` (the batch is there; in
use) -> ``release`` (sent or copied out: free again) or ``retire`` (a consumer may still map it:
never written again, the worker builds into a fresh region next time). ``lease`` lets a
same-host consumer keep a slot zero-copy, as long as the worker keeps one slot without a lease.
``detach`` takes a built batch that its consumer is not taking out of the worker's way: the
server keeps the region until the batch is released, the worker builds into a fresh one.

The table holds no lock: its owner (the pool's state, state.py) calls it under its own lock.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import time


class ServerSlot:
    """The server's mapping of one worker region."""

    def __init__(self, path: str, capacity: int, table: "SlotTable") -> None:
        # Our own descriptor keeps the region reachable after the worker is gone.
        self.fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(self.fd, capacity)
        except BaseException:
            os.close(self.fd)
            raise
        self.capacity = capacity
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.inode = os.fstat(self.fd).st_ino  # fd numbers are reused; inodes of live memfds are not
        self.table = table
        self.in_use = False
        self.orphan = False
        self.leased = False
        self.used_bytes = 0
        self.filled_at = 0.0  # time.monotonic() when the batch it holds was built
        self.owner: object = None  # who the batch is for (Task.owner)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view is still exported; the map goes when it is collected
            self.map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SlotTable:
    """The slots of one worker; see the module docstring."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.slots: list[ServerSlot | None] = [None] * num_slots
        self.reserved: set[int] = set()  # slots a task is being built into
        self.renew: set[int] = set()     # slots whose next batch must go to a fresh region
        self.leased = 0                  # slots a consumer holds zero-copy

    def reserve(self) -> tuple[int, bool] | None:
        """A free slot for the next task: ``(slot, renew)``, or None when every slot is busy."""
        for k, s in enumerate(self.slots):
            if k not in self.reserved and (s is None or not s.in_use):
                self.reserved.add(k)
                renew = k in self.renew
                self.renew.discard(k)
                return k, renew
        return None

    def unreserve(self, k: int, renew: bool = False) -> None:
        """The task of slot ``k`` ended without a batch (error, or its region could not be opened)."""
        self.reserved.discard(k)
        if renew:
            self.renew.add(k)

    def fill(self, k: int, region: ServerSlot | None, used_bytes: int, owner: object = None) -> ServerSlot | None:
        """The worker built a batch into slot ``k`` (into ``region`` when it reported a new one).

        Returns the slot, now in use; None if the server has no region for it (the batch is
        unreachable and must be built again; the slot gets a fresh region).
        """
        self.reserved.discard(k)
        if region is not None:
            old = self.slots[k]
            if old is not None:
                old.close()
            self.slots[k] = region
        slot = self.slots[k]
        if slot is None:
            self.renew.add(k)
            return None
        slot.in_use = True
        slot.used_bytes = used_bytes
        slot.owner = owner
        slot.filled_at = time.monotonic()
        return slot

    def lease(self, slot: ServerSlot) -> bool | None:
        """May a consumer keep ``slot`` until it drops the batch? True: granted now; False: no;
        None: it already had the lease."""
        if slot.leased:
            return None
        if slot.orphan or self.leased >= self.num_slots - 1:
            return False
        slot.leased = True
        self.leased += 1
        return True

    def _unlease(self, slot: ServerSlot) -> None:
        if slot.leased:
            slot.leased = False
            self.leased -= 1

    def release(self, slot: ServerSlot) -> None:
        """The batch in ``slot`` is no longer needed: the slot is free (closed if orphaned)."""
        slot.in_use = False
        self._unlease(slot)
        if slot.orphan:
            slot.close()

    def retire(self, slot: ServerSlot) -> None:
        """A consumer may still map ``slot``: never write it again; its worker gets a fresh region."""
        self._unlease(slot)
        self._forget(slot)
        slot.in_use = False
        slot.orphan = True
        slot.close()  # the consumer's own mapping keeps the region alive while it needs it

    def detach(self, slot: ServerSlot) -> None:
        """Take ``slot`` (in use) out of the table: it stays the server's, and open, until its
        batch is released, then closes; the worker builds into a fresh region in its place."""
        self._unlease(slot)
        self._forget(slot)
        slot.orphan = True

    def stuck(self, older_than: float) -> list[ServerSlot]:
        """Slots of the table whose batch was built before ``older_than`` (monotonic) and is
        still not released, oldest first."""
        return sorted((s for s in self.slots if s is not None and s.in_use and s.filled_at < older_than),
                      key=lambda s: s.filled_at)

    def _forget(self, slot: ServerSlot) -> None:
        for k, s in enumerate(self.slots):
            if s is slot:
                self.slots[k] = None
                self.renew.add(k)

    def orphan_all(self) -> None:
        """The worker died: its regions close once the batches they hold are released."""
        self.reserved.clear()
        for s in self.slots:
            if s is not None:
                s.orphan = True
                if not s.in_use:
                    s.close()

    def in_use(self) -> list[ServerSlot]:
        return [s for s in self.slots if s is not None and s.in_use]
