"""What to ask of which data server, and when: the consumer's scheduling, with no I/O.

The ``Fetcher`` tells the ``Scheduler`` which servers it can ask (``plan``'s ``usable``) and what
came back (``arrived``, ``declined``, ``lost``); the scheduler answers with ``Orders``: batches to
ask of each server, block hints, and hedged copies. Time comes in as ``now``, so every rule is
unit-tested with fake servers and a fake clock (tests/test_scheduler.py).

* **Shares follow measured speed.** Each batch, in the order the consumer needs them, goes to
  the server expected to deliver it first: a lane's ``done_at`` from its own time between
  batches (``lane.py``). A server twice as fast gets about twice the batches, and batches are
  delivered close to the order they are needed in, so a slow server does not pace the step.
* **Windows.** A server owes at most its window (2 x its worker processes, at least 4, or the
  window the user gave; wider while batches are small: they cost per batch, not per byte).
  Requests go out in groups of at least half a window: one frame and one wake-up of the server
  per group.
* **Bound ahead.** Nothing is asked more than ``AHEAD_WINDOWS`` x the servers' windows beyond the
  batch the consumer waits for, which bounds what the consumer holds.
* **Hedges.** The batch the consumer waits for is also asked of another server, once, when
  (a) a server with room would deliver it clearly before the one that has it (the head of the
  line stuck behind a slow, straggling or stalled server: a server late on a batch is expected
  later the longer it stays quiet); or (b) at the end of the list, or with a server idle, its
  server has been quiet for ``HEDGE_TAIL_S`` or ``HEDGE_TAIL_GAPS`` of its usual gaps. The first
  copy to come is used, the other dropped; a copy still owed counts against its server's window,
  so a stalled server is given nothing more (and is dropped after ``batch_timeout``). A copy
  that fails while the other is still owed is no error: only the last copy's failure is.
* **Affinity** (a block-shuffled plan: shards): a batch goes to the server owning its block
  (``affinity.py``, weighted by the servers' worker processes), so each block is read from
  storage by one node. A server with nothing of its own takes batches of blocks it built
  lately; a hedge of another's block waits ``HEDGE_AFFINITY_S`` (the owner may be fetching the
  block; another server would read it all again) unless the helper built that block lately.
  Owners are told of their blocks ahead of the blocks' first batches (``block_hints.py``).
* **Requeues.** What a failed or draining server owed goes back in order to the others.
* **Failed attempts** (``charged``): when a server's connection fails, the batch it was failing
  (bytes that failed their check, a payload cut short) counts one failed attempt; when no batch
  is to blame (a connection broken between frames, a damaged request refused, a stall), every
  batch it owes and delivered nothing since being asked for counts one (after a stall of
  ``batch_timeout``, every batch it owes). A connection that delivered something after a batch
  was asked made progress: that batch is not counted, so a link that breaks now and then never
  ends an iteration, and one that breaks before every delivery does within a few attempts
  (``attempts.py``).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Sequence, cast

from data_service.contract.batch_id import BatchId
from data_service.errors import ConfigError

from .affinity import Affinity
from ..resume.batch_list import Todo, indexed
from .block_hints import BlockHints
from .lane import Lane, Lanes

SMALL_BATCH_BYTES = 1 << 20  # batches up to this size get the wider window (``small_window``)
AHEAD_WINDOWS = 2  # batches asked for ahead of the awaited one: at most this x the windows
HEDGE_TAIL_S = 1.0  # nothing left to ask for: a server that delivered nothing for this long is hedged,
HEDGE_TAIL_GAPS = 4  # or for this many of its usual times between batches, if longer
HEDGE_AFFINITY_S = 10.0  # with affinity: a quiet owner may be fetching a block; wait this long
HEDGE_SOONER = 2.0  # a server with room is hedged to when it would deliver this many of its gaps sooner


@dataclass
class Orders:
    """One turn's requests: ``fetch`` and ``hint`` map an address to its batches, in order."""

    fetch: dict[str, list[BatchId]] = field(default_factory=lambda: collections.defaultdict(list))
    hint: dict[str, list[BatchId]] = field(default_factory=lambda: collections.defaultdict(list))


class Scheduler:
    """Which server builds each of ``batches`` (module docstring).

    Args:
        batches: the batches, in the order the consumer needs them (unique): a list, or a
            ``batch_list.BatchList`` (an epoch of millions of batches, nothing stored per batch).
        small_window: a server's window while batches are small (0: its window always).
        affinity: the plan's blocks and owners (None: any server is as good as another).
    """

    def __init__(self, batches: Sequence[BatchId], small_window: int = 0, affinity: Affinity | None = None) -> None:
        # A ``BatchList`` is kept as it is (arithmetic: nothing held per batch of the epoch);
        # a plain list gets a dict of positions.
        self.batches = indexed(batches)
        if not self.batches.unique():
            raise ConfigError("batches must be unique (seed, epoch, index)")
        self.todo = Todo(self.batches)  # sorted by position: requeued batches go back at its head
        self.lanes = Lanes(small_window)
        self.affinity = affinity
        self.hedges = 0
        self.failovers = 0
        self._hedged: set[BatchId] = set()  # asked of two servers, neither copy here yet
        self._spare: set[BatchId] = set()   # came from one server, a copy still owed by another
        self._hints = BlockHints(self.batches, affinity) if affinity is not None else None

    # -- servers
    def lost(self, address: str) -> int:
        """``address`` failed: what it owed is asked of the others; returns how many batches."""
        lane = self.lanes.get(address)
        if lane is None:
            return 0
        owed = [b for b in lane.outstanding if b not in self._spare]
        self._spare.difference_update(lane.outstanding)
        lane.outstanding.clear()
        if owed:
            self.failovers += 1
            self._requeue(owed)
        return len(owed)

    def charged(self, address: str, culprit: BatchId | None = None, stalled: bool = False) -> list[BatchId]:
        """The batches that count a failed attempt now that ``address``'s connection failed (ask
        before ``lost``): ``culprit`` alone when it owes it (the batch whose bytes failed their
        check, or whose payload was arriving); else each batch it owes and delivered nothing since
        it was asked for; with ``stalled`` (no batch for ``batch_timeout``) each batch it owes.
        Batches another server already delivered are never counted (module docstring)."""
        lane = self.lanes.get(address)
        if lane is None:
            return []
        owed = {b: asked for b, asked in lane.outstanding.items() if b not in self._spare}
        if culprit is not None and culprit in owed:
            return [culprit]
        return [b for b, asked in owed.items() if stalled or asked >= lane.last_batch]

    def owes_needed(self, address: str, batch: BatchId) -> bool:
        """``address`` owes ``batch`` and no copy of it came yet (a failure of it counts an attempt)."""
        lane = self.lanes.get(address)
        return lane is not None and batch in lane.outstanding and batch not in self._spare

    def declined(self, address: str, batch: BatchId, requeue: bool) -> bool:
        """``address`` answered ``batch`` with an error: True when it is a batch the consumer still
        needs and no other server owes it any more; with ``requeue`` (the server is shutting
        down) it is then asked of the others. A hedged batch's copy that fails while the other
        is still owed is False: the other copy may yet come, and its own failure decides."""
        lane = self.lanes.get(address)
        if lane is None or not lane.settled(batch):
            return False
        if batch in self._spare:
            self._spare.discard(batch)
            return False
        if batch in self._hedged:
            if self.lanes.owing(batch):
                return False  # stays hedged: one hedge per batch, the copy still owed is it
            self._hedged.discard(batch)
        if requeue:
            self._requeue([batch])
        return True

    # -- results
    def arrived(self, address: str, batch: BatchId, nbytes: int, now: float) -> bool:
        """A batch came from ``address``: True when it is one the consumer still needs."""
        lane = self.lanes.get(address)
        if lane is None or not lane.settled(batch):
            return False  # not ours (already asked of another, or an earlier iteration's)
        lane.arrived(now)
        if batch in self._spare:  # a hedged batch's second copy: the first was used
            self._spare.discard(batch)
            return False
        if self.affinity is not None:
            lane.built_block(self.affinity.block(batch))
        if batch in self._hedged:
            self._hedged.discard(batch)
            if self.lanes.owing(batch):
                self._spare.add(batch)
        self.lanes.set_small(nbytes <= SMALL_BATCH_BYTES)
        return True

    # -- asking
    def plan(self, nxt: int, usable: list[str], owners: tuple[str, ...], now: float,
             hint_ready: bool = True) -> Orders:
        """This turn's requests. ``nxt``: the position the consumer waits for; ``usable``: servers
        that may be asked (connected, not draining); ``owners``: servers owning blocks now
        (affinity); ``hint_ready``: every owner can hear hints."""
        orders = Orders()
        lanes = [self.lanes[a] for a in usable if a in self.lanes]
        limit = nxt + AHEAD_WINDOWS * max(1, sum(lane.window for lane in self.lanes.values()))
        if self.affinity is not None:
            weights = tuple(self.lanes[a].weight if a in self.lanes else 1.0 for a in owners)
            idle = self._plan_owned(self.affinity, orders, lanes, owners, weights, limit)
            if hint_ready:  # made with the affinity (__init__)
                cast(BlockHints, self._hints).announce(orders.hint, limit, owners, weights)
        else:
            idle = self._plan_fastest(orders, lanes, limit, now)
        for address, batches in orders.fetch.items():
            self.lanes[address].asked(batches, now)
        if nxt < len(self.batches):
            self._hedge(orders, lanes, nxt, now, idle or not self.todo)
        return orders

    def _ready(self, lane: Lane) -> bool:
        """Takes requests now: room, and either owes nothing or half a window is free."""
        room = lane.room()
        return room > 0 and (not lane.outstanding or room >= max(1, lane.window // 2))

    def _plan_fastest(self, orders: Orders, lanes: list[Lane], limit: int, now: float) -> bool:
        """Each batch to the server that would deliver it first. A batch whose best server takes no
        requests this turn (its window is full) waits for it, holding a place in its queue, so a
        slower server gets only the batches it would deliver first. Returns whether one stays idle."""
        room = {ln.address: ln.room() for ln in lanes if self._ready(ln)}
        if room and self.todo:
            queued = {ln.address: len(ln.outstanding) for ln in lanes}
            gap = self.lanes.default_gap()
            waiting: list[BatchId] = []
            while self.todo and self.todo.first_position() < limit and any(room.values()):
                best = min(lanes, key=lambda ln: (ln.done_at(queued[ln.address] + 1, now, gap), queued[ln.address]))
                batch = self.todo.popleft()
                queued[best.address] += 1
                if room.get(best.address, 0) > 0:
                    orders.fetch[best.address].append(batch)
                    room[best.address] -= 1
                else:
                    waiting.append(batch)
            self.todo.extendleft(reversed(waiting))
            for ln in lanes:  # a group the bound ahead cut short waits to be whole, unless the list ends
                group = orders.fetch.get(ln.address)
                if group and ln.outstanding and self.todo and len(group) < max(1, ln.window // 2):
                    del orders.fetch[ln.address]
                    self._requeue(group)
        return any(not ln.outstanding and not orders.fetch.get(ln.address) for ln in lanes)

    def _plan_owned(self, affinity: Affinity, orders: Orders, lanes: list[Lane], owners: tuple[str, ...],
                    weights: tuple[float, ...], limit: int) -> bool:
        """Each server takes the batches of the blocks it owns; one with room and nothing of its
        own takes batches of blocks it built lately. Returns whether a server stays idle."""
        head = []
        while self.todo and self.todo.first_position() < limit:
            head.append(self.todo.popleft())
        owner = {b: affinity.owner(b, owners, weights) for b in head}
        # no owner (None) while no server owns blocks: those batches go back to the todo below
        mine: dict[str | None, list[BatchId]] = collections.defaultdict(list)
        for b in head:
            mine[owner[b]].append(b)
        idle = False
        for lane in lanes:
            if not self._ready(lane):
                continue
            room = lane.room()
            take = mine[lane.address][:room]
            del mine[lane.address][:room]
            if len(take) < room and not lane.outstanding and lane.blocks:
                # idle: batches of blocks it built lately cost no extra read; the earliest first
                extra = sorted((b for a, bs in mine.items() if a != lane.address for b in bs
                                if affinity.block(b) in lane.blocks), key=self.batches.index_of)
                for b in extra[:room - len(take)]:
                    mine[owner[b]].remove(b)
                    take.append(b)
            idle = idle or (not take and not lane.outstanding)
            if take:
                orders.fetch[lane.address] = take
        rest = sorted((b for bs in mine.values() for b in bs), key=self.batches.index_of)
        self.todo.extendleft(reversed(rest))
        return idle

    def _hedge(self, orders: Orders, lanes: list[Lane], nxt: int, now: float, tail: bool) -> None:
        """Ask another server for the batch the consumer waits for too, once (module docstring)."""
        batch = self.batches[nxt]
        if batch in self._hedged:
            return
        holder = next((lane for lane in self.lanes.values() if batch in lane.outstanding), None)
        if holder is None:
            return  # arrived already, or not asked yet
        others = [lane for lane in lanes if lane is not holder and lane.room() > 0 and batch not in lane.outstanding
                  and not orders.fetch.get(lane.address)]
        if not others:
            return
        gap = self.lanes.default_gap()
        target = min(others, key=lambda ln: (ln.done_at(len(ln.outstanding) + 1, now, gap), len(ln.outstanding)))
        quiet = now - holder.last_progress
        ahead = holder.done_at(holder.rank(batch), now, gap) - target.done_at(len(target.outstanding) + 1, now, gap)
        sooner = ahead > max(HEDGE_SOONER * (target.gap or gap), 0.5 * (holder.gap or gap))
        settle = max(HEDGE_AFFINITY_S if self.affinity is not None else HEDGE_TAIL_S, HEDGE_TAIL_GAPS * holder.gap)
        if self.affinity is not None and self.affinity.block(batch) not in target.blocks:
            # another server would read the whole block again: only once the owner is long quiet
            if quiet < settle or not (tail or sooner):
                return
        elif not sooner and not (tail and quiet >= settle):
            return
        self._hedged.add(batch)
        self.hedges += 1
        orders.fetch[target.address].append(batch)
        target.asked([batch], now)

    def _requeue(self, batches: list[BatchId]) -> None:
        """Ask again for ``batches`` (those no other server owes: hedged ones); ``todo`` stays in
        order, which the bound ahead relies on."""
        batches = [b for b in batches if not self.lanes.owing(b)]
        if not batches:
            return
        last = max(self.batches.index_of(b) for b in batches)
        head = []  # ``todo`` is sorted: only its head, up to the last requeued position, needs merging
        while self.todo and self.todo.first_position() < last:
            head.append(self.todo.popleft())
        self.todo.extendleft(sorted([*head, *batches], key=self.batches.index_of, reverse=True))
