"""A consumer's list of batches, held as arithmetic: nothing is stored per batch.

A rank's share of an epoch is every R-th batch from its rank (``data_service.contract.sampler.rank_share``),
a loader worker's part every N-th of those, from the resume point on: batch ``j`` of it is
``(first + j * step) % num_batches`` (``Stride``). ``BatchList`` is a list of ``(epoch, index)``
pairs made of such pieces (this epoch's part, then maybe the next epoch's first few batches);
``BatchRefs`` the ``pb.BatchRef`` s the scheduler asks for. Each finds item ``i``, and the
position of a batch (``index_of``), by arithmetic, so an epoch of millions of batches starts as
fast, and takes as little memory, as one of a thousand.
"""
from __future__ import annotations

import bisect
import collections
import itertools
import math
from typing import Iterable, Iterator, Sequence

from data_service.contract.sampler import rank_share_size
from data_service.protocol.generated import pb

Key = tuple[int, int, int]


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


class BatchList(Sequence[tuple[int, int]]):
    """``(epoch, index)`` pairs: each segment an epoch and a sequence of its batch indices.

    Slices (step 1) and ``+`` make new lists of segments; ``index`` asks each segment of the
    epoch (a ``Stride`` answers by arithmetic)."""

    def __init__(self, segments: Iterable[tuple[int, Sequence[int]]] = ()) -> None:
        self.segments = [(int(e), s) for e, s in segments if len(s)]
        self._ends = list(itertools.accumulate(len(s) for _, s in self.segments))
        self._where: dict[int, dict[int, int]] = {}  # a segment given as a list: its positions, made on first use

    @classmethod
    def of(cls, items: "Iterable[tuple[int, int]] | BatchList") -> "BatchList":
        """``items`` as a BatchList (a plain list: one segment per run of one epoch)."""
        if isinstance(items, BatchList):
            return items
        return cls((e, [i for _, i in run]) for e, run in itertools.groupby(items, key=lambda item: item[0]))

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
            return BatchList(out)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} is outside 0..{len(self) - 1}")
        k = bisect.bisect_right(self._ends, i)
        e, s = self.segments[k]
        return e, s[i - (self._ends[k - 1] if k else 0)]

    def __add__(self, other: "Iterable[tuple[int, int]] | BatchList") -> "BatchList":
        return BatchList(self.segments + BatchList.of(other).segments)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for e, s in self.segments:
            for i in s:
                yield e, i

    def __contains__(self, item: object) -> bool:
        try:
            self.index(item)
        except ValueError:
            return False
        return True

    def index(self, item: object, start: int = 0, stop: int | None = None) -> int:
        """Position of the first ``(epoch, index)`` pair equal to ``item``."""
        if start or stop is not None:
            raise ValueError("BatchList.index takes no start or stop")
        if isinstance(item, tuple) and len(item) == 2:
            begin = 0
            for k, ((e, s), end) in enumerate(zip(self.segments, self._ends)):
                if e == item[0]:
                    if hasattr(s, "_solve"):  # a Stride, or a dealt share (resharding.Picked)
                        j = s._solve(item[1])
                        if j is not None:
                            return begin + j
                    elif isinstance(s, range):
                        if item[1] in s:
                            return begin + s.index(item[1])
                    else:
                        where = self._where.get(k)
                        if where is None:
                            where = self._where[k] = {i: j for j, i in reversed(list(enumerate(s)))}
                        if item[1] in where:
                            return begin + where[item[1]]
                begin = end
        raise ValueError(f"{item!r} is not in the list")

    def unique(self) -> bool:
        epochs = [e for e, _ in self.segments]
        if len(set(epochs)) == len(epochs):
            return all(s.unique() if hasattr(s, "unique") else len(set(s)) == len(s) for _, s in self.segments)
        return len(set(self)) == len(self)


class BatchRefs(Sequence[pb.BatchRef]):
    """The ``pb.BatchRef`` of each pair of a ``BatchList``, made when asked for."""

    def __init__(self, seed: int, batches: BatchList) -> None:
        self.seed = seed
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return BatchRefs(self.seed, self.batches[i])
        e, index = self.batches[i]
        return pb.BatchRef(seed=self.seed, epoch=e, index=index)

    def __iter__(self) -> Iterator[pb.BatchRef]:
        for e, index in self.batches:
            yield pb.BatchRef(seed=self.seed, epoch=e, index=index)

    def index_of(self, key: Key) -> int:
        """Position of the batch ``(seed, epoch, index)``; KeyError when it is not in the list."""
        segments = self.batches.segments
        if key[0] == self.seed and len(segments) == 1 and isinstance(segments[0][1], Stride):
            j = segments[0][1]._solve(key[2]) if key[1] == segments[0][0] else None  # the usual list: one piece
            if j is not None:
                return j
        elif key[0] == self.seed:
            try:
                return self.batches.index((key[1], key[2]))
            except ValueError:
                pass
        raise KeyError(key)

    def unique(self) -> bool:
        return self.batches.unique()


class IndexedRefs(Sequence[pb.BatchRef]):
    """A list of refs given as such, with a dict of their positions."""

    def __init__(self, refs: Iterable[pb.BatchRef]) -> None:
        self._refs = list(refs)
        self._pos = {(r.seed, r.epoch, r.index): i for i, r in enumerate(self._refs)}

    def __len__(self) -> int:
        return len(self._refs)

    def __getitem__(self, i):
        return self._refs[i]

    def __iter__(self) -> Iterator[pb.BatchRef]:
        return iter(self._refs)

    def index_of(self, key: Key) -> int:
        return self._pos[key]

    def unique(self) -> bool:
        return len(self._pos) == len(self._refs)


def as_refs(refs: Sequence[pb.BatchRef]) -> "BatchRefs | IndexedRefs":
    """``refs`` with ``index_of`` and ``unique`` (a plain list gets a dict of positions)."""
    return refs if isinstance(refs, (BatchRefs, IndexedRefs)) else IndexedRefs(refs)


class Positions:
    """``positions[key]``: where the batch ``key`` stands in the list (computed, not stored)."""

    __slots__ = ("_refs",)

    def __init__(self, refs: "BatchRefs | IndexedRefs") -> None:
        self._refs = refs

    def __getitem__(self, key: Key) -> int:
        return self._refs.index_of(key)

    def __contains__(self, key: object) -> bool:
        try:
            self._refs.index_of(key)  # type: ignore[arg-type]
        except KeyError:
            return False
        return True


class Todo:
    """The refs not asked for yet, in list order: a cursor into the list, and before it a short
    deque of refs that went back (requeued, or held back a turn). Every ref that goes back was
    taken from before the cursor, so the deque's refs all come before the cursor's."""

    def __init__(self, refs: "BatchRefs | IndexedRefs") -> None:
        self._refs = refs
        self._next = 0
        self._back: collections.deque[pb.BatchRef] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._back) or self._next < len(self._refs)

    def __len__(self) -> int:
        return len(self._back) + len(self._refs) - self._next

    def __getitem__(self, i: int) -> pb.BatchRef:
        if 0 <= i < len(self._back):
            return self._back[i]
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} is outside 0..{len(self) - 1}")
        return self._refs[self._next + i - len(self._back)]

    def first_position(self) -> int:
        """Position in the list of the head ref (the todo must not be empty)."""
        if self._back:
            r = self._back[0]
            return self._refs.index_of((r.seed, r.epoch, r.index))
        return self._next

    def popleft(self) -> pb.BatchRef:
        if self._back:
            return self._back.popleft()
        if self._next >= len(self._refs):
            raise IndexError("pop from an empty Todo")
        self._next += 1
        return self._refs[self._next - 1]

    def extendleft(self, refs: Iterable[pb.BatchRef]) -> None:
        """Put ``refs`` back at the head, like ``deque.extendleft`` (the last one given first)."""
        self._back.extendleft(refs)

    def __iter__(self) -> Iterator[pb.BatchRef]:
        yield from self._back
        for i in range(self._next, len(self._refs)):
            yield self._refs[i]
