"""Resume an epoch on another number of data-parallel ranks: what is left of it, dealt again.

Every rank's state says exactly which batches it trained: rank ``r`` of ``R`` trains batches
``r, r+R, r+2R, ...`` of the epoch (``rank_share``), and its ``position`` counts how many. The
union of the old ranks' states is therefore the set of batches of the epoch not yet trained.
:func:`merge_states` records it as one resume point that any number of ranks can load; each new
rank ``r'`` of ``R'`` then takes items ``r', r'+R', ...`` of the untrained batches, in epoch order,
every rank the same count (``remainder="drop"`` leaves out the last ``M % R'``, ``"pad"`` wraps
round to the first ones). The next epochs are shared among the ``R'`` ranks as usual::

    states = [every old rank's loader.state_dict()]          # gathered into the checkpoint
    loader.load_state_dict(states)                          # on each new rank, any world size

A resume point stays small whatever the epoch's length: it holds the old world's size and each
rank's position (``earlier_worlds``), and the untrained batches are computed from them. A world
resumed again before the epoch ends adds its own entry, so 4 -> 2 -> 3 ranks in one epoch is
exact too. Batch contents depend on (seed, epoch, index) only, so they do not change; only which
rank trains them does.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence, cast

import numpy as np

from data_service.errors import ConfigError

from .batch_list import Stride
from .state import WORLDS, EarlierWorld, Remainder, ResumeState

def share_size(m: int, size: int, remainder: str | Remainder) -> int:
    """Batches each of ``size`` ranks takes of ``m``; 0 when ``drop`` leaves none."""
    return m // size if Remainder.parse(remainder) is Remainder.DROP else -(-m // size)


def merge_states(states: Sequence[Mapping[str, Any] | ResumeState], remainder: str = "drop") -> dict[str, Any]:
    """One resume point from the states of every rank of the old world (each as of its last batch).

    Args:
        states: one ``state_dict()`` per old data-parallel rank (any order; ranks that share a
            ``dp_rank`` may each give theirs, they must agree).
        remainder: what the old world used (``"drop"`` or ``"pad"``): it decides which batches a
            rank that finished its share trained. The job's own setting, unchanged across resumes.

    Returns:
        ``{"version", "epoch", "seed", "position": 0, "earlier_worlds": [...]}``: load it (or the
        list itself) on any number of ranks. A finished epoch gives the next one's start.

    Raises:
        ConfigError: states of different seeds, epochs or worlds, or a rank missing, naming them.
    """
    return merge(states, remainder).to_dict()


def merge(states: Sequence[Mapping[str, Any] | ResumeState], remainder: str | Remainder = "drop") -> ResumeState:
    """:func:`merge_states` as the typed value."""
    if isinstance(states, (dict, ResumeState)) or not states:
        raise ConfigError(f"merge_states takes a list of every old rank's state, got {states!r}")
    rem = Remainder.parse(remainder)
    by_rank = _by_rank([ResumeState.from_dict(s) for s in states])
    size = len(by_rank)
    seed = by_rank[0].seed
    first = min(s.epoch for s in by_rank.values())
    # A rank already at the start of the next epoch finished its share of this one.
    ahead = [r for r, s in by_rank.items() if s.epoch != first]
    if any(by_rank[r].epoch != first + 1 or by_rank[r].position for r in ahead):
        raise ConfigError(f"the states are at (epoch, position) {sorted((s.epoch, s.position) for s in by_rank.values())}"
                          ": ranks that trained in step are at most one finished share apart; give the states of "
                          "one checkpoint")
    history = next(s.earlier_worlds for s in by_rank.values() if s.epoch == first)
    for r, s in by_rank.items():
        if s.seed != seed:
            raise ConfigError(f"rank {r}'s state has seed={s.seed}, rank 0's seed={seed}: give the states "
                              "of one job")
        if s.epoch == first and s.earlier_worlds != history:
            raise ConfigError(f"rank {r}'s state continues another deal than the others' ({WORLDS}="
                              f"{[w.to_dict() for w in s.earlier_worlds]!r}); give the states of one checkpoint")
    positions = tuple(None if r in ahead else by_rank[r].position for r in range(size))
    return ResumeState(epoch=first, seed=seed, position=0,
                       earlier_worlds=(*history, EarlierWorld(size, positions, rem)))


def _by_rank(states: Sequence[ResumeState]) -> dict[int, ResumeState]:
    by_rank: dict[int, ResumeState] = {}
    size = states[0].dp_size
    for s in states:
        if s.dp_size is None or s.dp_rank is None:
            raise ConfigError(f"state {s.to_dict()!r} lacks dp_rank and dp_size; give what each rank's state_dict() "
                              "returned")
        if s.dp_size != size:
            raise ConfigError(f"states of dp_size={size} and dp_size={s.dp_size} mixed: "
                              "give the states of one world (one checkpoint)")
        known = by_rank.setdefault(s.dp_rank, s)
        if (known.epoch, known.position) != (s.epoch, s.position):
            raise ConfigError(f"two states of dp_rank={s.dp_rank} disagree ({known.to_dict()} and {s.to_dict()}); "
                              "ranks of one data-parallel group train the same batches")
    if sorted(by_rank) != list(range(size or 0)):
        raise ConfigError(f"states of dp_size={size} must hold dp_rank 0..{(size or 1) - 1}, got dp_rank(s) "
                          f"{sorted(by_rank)}: give every rank's state (the launcher gathers them into its checkpoint)")
    return by_rank


def deal(states: Sequence[Mapping[str, Any] | ResumeState], dp_size: int, remainder: str = "drop") -> list[dict[str, Any]]:
    """The state of each of ``dp_size`` new ranks from every old rank's state (see module doc).

    Each new rank ``r`` loads ``deal(...)[r]``: it trains its part of the epoch's untrained
    batches, the same count as every other rank, then the next epochs as usual.
    """
    if not isinstance(dp_size, int) or dp_size < 1:
        raise ConfigError(f"dp_size={dp_size!r} must be an int >= 1")
    point = merge(states, remainder)
    return [point.at(dp_rank=r, dp_size=dp_size).to_dict() for r in range(dp_size)]


def lockstep_states(state: dict[str, Any] | ResumeState) -> list[ResumeState]:
    """Every rank's state from one rank's, for ranks that step together (DDP: every rank has
    trained as many batches of its share), e.g. the one state Lightning keeps, rank 0's."""
    parsed = ResumeState.from_dict(state)
    if parsed.dp_size is None:
        raise ConfigError(f"state {parsed.to_dict()!r} has no dp_size; give what state_dict() returned")
    return [parsed.at(dp_rank=r) for r in range(parsed.dp_size)]


def _worlds(worlds: Sequence[dict[str, Any] | EarlierWorld]) -> list[EarlierWorld]:
    return [EarlierWorld.from_dict(w) for w in worlds]


def steps_before_deal(worlds: Sequence[dict[str, Any] | EarlierWorld]) -> int:
    """Steps of the epoch taken before it was dealt again, when every world's ranks stepped together."""
    return sum(max((p for p in w.positions if p is not None), default=0) for w in _worlds(worlds))


def remaining(num_batches: int, worlds: Sequence[dict[str, Any] | EarlierWorld]) -> Sequence[int]:
    """The epoch's batch indices no earlier world trained, in epoch order.

    A ``range`` while every rank of every world stopped at the same position (ranks that step
    together: DDP), else a sorted array.
    """
    rest: Sequence[int] = range(num_batches)
    for w in _worlds(worlds):
        rest = _untrained(rest, w)
    return rest


def _untrained(rest: Sequence[int], world: EarlierWorld) -> Sequence[int]:
    m = len(rest)
    size = world.dp_size
    full = share_size(m, size, world.remainder)
    done = world.done(full)
    for r, p in enumerate(done):
        if not 0 <= p <= full:
            raise ConfigError(f"rank {r} of {size} is at position={p}, outside its share of 0..{full} batches: "
                              "the state belongs to another pipeline or batch size")
    if len(set(done)) == 1 and done[0] * size <= m:  # ranks in step: the first p*R went, in order
        return rest[done[0] * size:]
    trained = np.zeros(m, dtype=bool)
    for r, p in enumerate(done):
        trained[(np.arange(p, dtype=np.int64) * size + r) % m] = True
    values = np.arange(rest.start, rest.stop, rest.step) if isinstance(rest, range) else np.asarray(rest)
    return cast(Sequence[int], values[~trained])  # a sorted 1-d int array; numpy does not call it a Sequence


def dealt_share(num_batches: int, worlds: Sequence[dict[str, Any] | EarlierWorld], dp_rank: int, dp_size: int,
                remainder: str | Remainder = "drop") -> "Picked":
    """Rank ``dp_rank`` of ``dp_size``'s batches of an epoch that ``worlds`` trained part of."""
    rest = remaining(num_batches, worlds)
    m = len(rest)
    return Picked(rest, Stride(dp_rank, dp_size, share_size(m, dp_size, remainder), max(m, 1)))


class Picked(Sequence[int]):
    """``base[positions[j]]``: a rank's dealt share, held as arithmetic over ``base`` (a range or
    a sorted array of distinct batch indices) and a ``Stride`` of positions in it."""

    __slots__ = ("base", "positions")

    def __init__(self, base: Sequence[int], positions: Stride) -> None:
        self.base, self.positions = base, positions

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Picked(self.base, self.positions[i])
        return int(self.base[self.positions[i]])

    def __iter__(self):
        base = self.base
        for p in self.positions:
            yield int(base[p])

    def _solve(self, value: object) -> int | None:
        """Position of ``value`` here, or None (the same contract as ``Stride._solve``)."""
        if not isinstance(value, (int, np.integer)):
            return None
        base = self.base
        if isinstance(base, range):
            if value not in base:
                return None
            where = base.index(cast(int, value))  # an int or np.integer: range.index compares by value
        else:
            where = int(np.searchsorted(base, value))
            if where >= len(base) or base[where] != value:
                return None
        return self.positions._solve(where)

    def __contains__(self, value: object) -> bool:
        return self._solve(value) is not None

    def index(self, value: object, start: int = 0, stop: int | None = None) -> int:
        j = self._solve(value)
        if j is None or j < start or (stop is not None and j >= stop):
            raise ValueError(f"{value!r} is not in this share")
        return j

    def unique(self) -> bool:
        return self.positions.unique()

    def __repr__(self) -> str:
        base = self.base if isinstance(self.base, range) else f"array(len={len(self.base)})"
        return f"Picked({base}, {self.positions!r})"
