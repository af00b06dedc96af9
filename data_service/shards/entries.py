"""Which of an index's per-sample entries cannot describe their sample, and the error that names one.

An entry is bad when its bytes lie outside its shard (an offset before the first byte, an end past
the last), when its label lies outside the classes, or when it overlaps the next sample of its
shard (a shard's samples follow one another in byte order). A damaged index usually spoils one
entry, so a bad entry refuses its own sample only (:class:`CorruptEntryError`, which the image
pipeline turns into a counted skip under ``on_corrupt="skip"``): the shard's other samples are
whole and still read.

Overlaps name two samples, and only one of them is wrong. An index with per-sample checksums
leaves them to the checksum, which finds the one whose bytes are not its own; without checksums
both are refused. :func:`find` works through the columns :data:`~.format.CHECK_CHUNK` samples at
a time (vectorised, read with ``pread`` for an index.bin), so it costs a shard's first use about
0.1 ms and bounded memory however large the shard.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

# why an entry is bad, in the order a message prefers when one entry has several faults
OFFSET, END, LABEL, OVERLAP, OVERLAPPED = range(5)


class CorruptEntryError(ConfigError):
    """Sample ``sample``'s index entry cannot describe it (see the module); ``shard`` names its shard."""

    def __init__(self, message: str, *, sample: int, shard: str) -> None:
        super().__init__(message)
        self.sample, self.shard = sample, shard


@dataclass(frozen=True)
class BadEntries:
    """The bad entries found in a run of samples: their numbers (ascending) and, per number, why."""

    samples: np.ndarray
    why: np.ndarray

    def __len__(self) -> int:
        return len(self.samples)

    def reason(self, i: int) -> int | None:
        """Why sample ``i``'s entry is bad, None when it is not."""
        k = int(np.searchsorted(self.samples, i))
        return int(self.why[k]) if k < len(self.samples) and int(self.samples[k]) == i else None

    def mask(self, first: int, end: int) -> np.ndarray:
        """One flag per sample of ``first..end-1``: True where its entry is bad."""
        out = np.zeros(end - first, dtype=bool)
        a, b = np.searchsorted(self.samples, [first, end])
        out[self.samples[a:b] - first] = True
        return out


NONE = BadEntries(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint8))


def find(index, first: int, end: int, *, overlaps: bool, chunk: int, first_only: bool = False) -> BadEntries:
    """The bad entries among samples ``first..end-1`` of ``index`` (a :class:`~.format.ShardIndex`).

    ``overlaps``: count overlapping neighbours as bad (both of them). ``first_only``: stop at the
    first chunk holding a bad entry (a whole-index check that refuses at the first one).
    """
    bounds, sizes = index.shards.first, index.shards.sizes
    classes = len(index.classes)
    found, reasons = [], []
    for a in range(first, end, chunk):
        b = min(end, a + chunk)
        lo, hi = max(first, a - 1), min(end, b + 1)  # and a neighbour each side: they bound our ends
        offsets = index.values("offsets", lo, hi)
        lengths = index.values("lengths", lo, hi).astype(np.int64)
        labels = index.values("labels", lo, hi)
        s0, s1 = (int(np.searchsorted(bounds, j, side="right")) - 1 for j in (lo, hi - 1))
        limit: int | np.ndarray  # one shard's size, or each sample's own shard's size
        if s0 == s1:
            owner, limit = None, int(sizes[s0])
        else:
            counts = np.diff(np.clip(bounds[s0:s1 + 2], lo, hi))
            owner = np.repeat(np.arange(s0, s1 + 1), counts)
            limit = np.asarray(sizes, dtype=np.int64)[owner]
        ends = offsets + lengths
        masks = [offsets < 0, ends > limit, (labels < 0) | (labels >= classes) if classes else labels < 0]
        if overlaps:
            # sample j's end past sample j+1's start, within one shard only; an entry already outside
            # its shard is the wrong one, and implicates no neighbour
            inside = ~(masks[OFFSET] | masks[END])
            runs = (ends[:-1] > offsets[1:]) & inside[:-1] & inside[1:]
            if owner is not None:
                runs &= owner[1:] == owner[:-1]
            masks += [np.append(runs, False), np.insert(runs, 0, False)]
        why = np.full(hi - lo, 255, dtype=np.uint8)
        for code in reversed(range(len(masks))):  # the first reason wins
            why[masks[code]] = code
        why = why[a - lo:b - lo]
        at = np.flatnonzero(why != 255)
        if len(at):
            found.append(at + a)
            reasons.append(why[at])
            if first_only:
                break
    if not found:
        return NONE
    return BadEntries(np.concatenate(found).astype(np.int64), np.concatenate(reasons))


def describe(index, i: int, why: int) -> str:
    """What is wrong with sample ``i``'s entry (``why`` from :func:`find`), naming its shard and values."""
    s = index.shard_at(i)
    name, size = index.shards.name(s), int(index.shards.sizes[s])
    offset, length, label = (index.value(c, i) for c in ("offsets", "lengths", "labels"))
    if why == OFFSET:
        return f"sample {i} of shard {name} starts at offset {offset}, before the shard's first byte"
    if why == END:
        return (f"sample {i} (offset {offset}, length {length}: bytes up to {offset + length}) lies past the end "
                f"of shard {name} ({size} bytes)")
    if why == OVERLAP:
        return (f"sample {i} of shard {name} (bytes {offset}..{offset + length}) runs into sample {i + 1}, which "
                f"starts at byte {index.value('offsets', i + 1)} (a shard's samples follow one another in byte order "
                "without overlapping)")
    if why == OVERLAPPED:
        before = index.value("offsets", i - 1) + index.value("lengths", i - 1)
        return (f"sample {i} of shard {name} starts at byte {offset}, inside sample {i - 1}, which ends at byte "
                f"{before} (a shard's samples follow one another in byte order without overlapping)")
    span = f"0..{len(index.classes) - 1} ({len(index.classes)} classes)" if index.classes else "0 and up"
    return f"sample {i} of shard {name} has label {label}, outside {span}"


def overlap(index, i: int) -> str:
    """How sample ``i``'s entry overlaps a neighbour of its shard ("" when it does not): what a checksum
    mismatch blames on the index rather than on the shard."""
    s = index.shard_at(i)
    first, end, size = int(index.shards.first[s]), int(index.shards.first[s + 1]), int(index.shards.sizes[s])

    def stop(j: int) -> int:
        return index.value("offsets", j) + index.value("lengths", j)

    def inside(j: int) -> bool:  # an entry outside its shard is the wrong one, and implicates no neighbour
        return 0 <= index.value("offsets", j) and stop(j) <= size

    if not inside(i):
        return ""
    if i + 1 < end and inside(i + 1) and stop(i) > index.value("offsets", i + 1):
        return describe(index, i, OVERLAP)
    if i > first and inside(i - 1) and stop(i - 1) > index.value("offsets", i):
        return describe(index, i, OVERLAPPED)
    return ""
