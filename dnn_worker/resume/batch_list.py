"""A consumer's list of batches, held as arithmetic: nothing is stored per batch.

A rank's share of an epoch is every R-th batch from its rank (``data_service.contract.sampler.rank_share``),
a loader worker's part every N-th of those, from the resume point on: batch ``j`` of it is
``(first + j * step) % num_batches`` (``Stride``). ``BatchList`` is a list of one seed's
``BatchId`` s made of such pieces (this epoch's part, then maybe the next epoch's first few
batches), what a dataset iterates and its scheduler asks for. It finds item ``i``, and the position
of a batch (``index_of``), by arithmetic, so an epoch of millions of batches starts as fast, and
takes as little memory, as one of a thousand.
"""
from __future__ import annotations

import bisect
import collections
import itertools
import math
from typing import Iterable, Iterator, Sequence

from data_service.contract.batch_id import BatchId
from data_service.contract.sampler import rank_share_size


class Stride(Sequence[int]):
    """``(first + j * step) % modulo`` for ``j`` in ``range(length)``."""

    __slots__ = ("first", "step", "length", "modulo", "_g", "_period", "_inverse")

    def __init__(self, first: int, step: int, length: int, modulo: int) -> None:
        if modulo < 1 or length < 0:
            raise ValueError(f"modulo={modulo} must be >= 1 and length={length} >= 0")
        self.first, self.step, self.length, self.modulo = first % modulo, step, length, modulo
        self._g = math.gcd(step, modulo)  # the values repeat every modulo / g items
        self._period = modulo // self._g
        self._inverse = pow(step // self._g, -1, self._period)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        if isinstance(i, slice):
            r = range(self.length)[i]
            return Stride(self.first + r.start * self.step, self.step * r.step, len(r), self.modulo)
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError(f"index {i} is outside 0..{self.length - 1}")
        return (self.first + i * self.step) % self.modulo

    def __iter__(self) -> Iterator[int]:
        v, step, m = self.first, self.step, self.modulo
        for _ in range(self.length):
            yield v
            v = (v + step) % m

    def __contains__(self, value: object) -> bool:
        return self._solve(value) is not None

    def index(self, value: object, start: int = 0, stop: int | None = None) -> int:
        """The first ``j`` with ``self[j] == value`` (a linear congruence, solved), in ``start..stop``."""
        j = self._solve(value)
        if j is not None and (start or stop is not None):
            period = self._period
            j += -(-(start - j) // period) * period if j < start else 0
            if j >= self.length or (stop is not None and j >= stop):
                j = None
        if j is None:
            raise ValueError(f"{value!r} is not in {self!r}")
        return j

    def _solve(self, value: object) -> int | None:
        if not isinstance(value, int) or not 0 <= value < self.modulo:
            return None
        d = value - self.first
        if d % self._g:
            return None
        j = (d // self._g) * self._inverse % self._period
        return j if j < self.length else None

    def unique(self) -> bool:
        return self.length <= self._period

    def __repr__(self) -> str:
        return f"Stride(first={self.first}, step={self.step}, length={self.length}, modulo={self.modulo})"


def rank_stride(num_batches: int, rank: int, world_size: int, remainder: str = "drop") -> Stride:
    """``rank_share`` (same batches, same errors) as a ``Stride``: nothing held per batch."""
    return Stride(rank, world_size, rank_share_size(num_batches, rank, world_size, remainder), num_batches)


class BatchList(Sequence[BatchId]):
    """The batches of the plan seeded by ``seed``: each segment an epoch and a sequence of its batch indices.

    Slices (step 1) and ``+`` make new lists of segments; ``index_of`` asks each segment of the
    batch's epoch (a ``Stride`` answers by arithmetic)."""

    def __init__(self, seed: int, segments: Iterable[tuple[int, Sequence[int]]] = ()) -> None:
        self.seed = seed
        self.segments = [(int(e), s) for e, s in segments if len(s)]
        self._ends = list(itertools.accumulate(len(s) for _, s in self.segments))
        self._where: dict[int, dict[int, int]] = {}  # a segment given as a list: its positions, made on first use

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, i):
        if isinstance(i, slice):
            r = range(len(self))[i]
            if r.step != 1:
                raise ValueError(f"a BatchList slices with step 1, not {r.step}")
            out, start = [], 0
            for (e, s), end in zip(self.segments, self._ends):
                lo, hi = max(r.start, start), min(r.stop, end)
                if lo < hi:
                    out.append((e, s[lo - start:hi - start]))
                start = end
            return BatchList(self.seed, out)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} is outside 0..{len(self) - 1}")
        k = bisect.bisect_right(self._ends, i)
        e, s = self.segments[k]
        return BatchId(self.seed, e, s[i - (self._ends[k - 1] if k else 0)])

    def __add__(self, other: "BatchList") -> "BatchList":
        if other.segments and other.seed != self.seed:
            raise ValueError(f"a BatchList of seed {self.seed} cannot take batches of seed {other.seed}")
        return BatchList(self.seed, self.segments + other.segments)

    def __iter__(self) -> Iterator[BatchId]:
        for e, s in self.segments:
            for i in s:
                yield BatchId(self.seed, e, i)

    def __contains__(self, item: object) -> bool:
        try:
            self.index_of(item)  # type: ignore[arg-type]
        except KeyError:
            return False
        return True

    def index_of(self, batch: BatchId) -> int:
        """Position of ``batch`` in the list; KeyError when it is not there."""
        if isinstance(batch, BatchId) and batch.seed == self.seed:
            begin = 0
            for k, ((e, s), end) in enumerate(zip(self.segments, self._ends)):
                if e == batch.epoch:
                    if hasattr(s, "_solve"):  # a Stride, or a dealt share (resharding.Picked)
                        j = s._solve(batch.index)
                    elif isinstance(s, range):
                        j = s.index(batch.index) if batch.index in s else None
                    else:
                        where = self._where.get(k)
                        if where is None:
                            where = self._where[k] = {i: j for j, i in reversed(list(enumerate(s)))}
                        j = where.get(batch.index)
                    if j is not None:
                        return begin + j
                begin = end
        raise KeyError(batch)

    def unique(self) -> bool:
        epochs = [e for e, _ in self.segments]
        if len(set(epochs)) == len(epochs):
            return all(s.unique() if hasattr(s, "unique") else len(set(s)) == len(s) for _, s in self.segments)
        return len(set(self)) == len(self)


class IndexedBatches(Sequence[BatchId]):
    """A list of batches given as such (of any seeds), with a dict of their positions."""

    def __init__(self, batches: Iterable[BatchId]) -> None:
        self._batches = list(batches)
        self._pos = {b: i for i, b in enumerate(self._batches)}

    def __len__(self) -> int:
        return len(self._batches)

    def __getitem__(self, i):
        return self._batches[i]

    def __iter__(self) -> Iterator[BatchId]:
        return iter(self._batches)

    def index_of(self, batch: BatchId) -> int:
        """Position of ``batch`` in the list; KeyError when it is not there."""
        return self._pos[batch]

    def unique(self) -> bool:
        return len(self._pos) == len(self._batches)


def indexed(batches: Sequence[BatchId]) -> "BatchList | IndexedBatches":
    """``batches`` with ``index_of`` and ``unique`` (a plain list gets a dict of positions)."""
    return batches if isinstance(batches, (BatchList, IndexedBatches)) else IndexedBatches(batches)


class Todo:
    """The batches not asked for yet, in list order: a cursor into the list, and before it a short
    deque of batches that went back (requeued, or held back a turn). Every batch that goes back was
    taken from before the cursor, so the deque's batches all come before the cursor's."""

    def __init__(self, batches: "BatchList | IndexedBatches") -> None:
        self._batches = batches
        self._next = 0
        self._back: collections.deque[BatchId] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._back) or self._next < len(self._batches)

    def __len__(self) -> int:
        return len(self._back) + len(self._batches) - self._next

    def __getitem__(self, i: int) -> BatchId:
        if 0 <= i < len(self._back):
            return self._back[i]
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} is outside 0..{len(self) - 1}")
        return self._batches[self._next + i - len(self._back)]

    def first_position(self) -> int:
        """Position in the list of the head batch (the todo must not be empty)."""
        return self._batches.index_of(self._back[0]) if self._back else self._next

    def popleft(self) -> BatchId:
        if self._back:
            return self._back.popleft()
        if self._next >= len(self._batches):
            raise IndexError("pop from an empty Todo")
        self._next += 1
        return self._batches[self._next - 1]

    def extendleft(self, batches: Iterable[BatchId]) -> None:
        """Put ``batches`` back at the head, like ``deque.extendleft`` (the last one given first)."""
        self._back.extendleft(batches)

    def __iter__(self) -> Iterator[BatchId]:
        yield from self._back
        for i in range(self._next, len(self._batches)):
            yield self._batches[i]
