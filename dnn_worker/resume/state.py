"""A consumer's resume state as one typed value: parsed once where it enters, a plain dict where it leaves.

Every consumer stage's ``state_dict()`` still returns a plain dict (``torch.save`` and
``torch.load(weights_only=True)`` take it, and Lightning and the launcher's checkpoint hold it), made
by :meth:`ResumeState.to_dict`; ``load_state_dict`` reads it back with :meth:`ResumeState.from_dict`,
which checks every field once and names what is wrong. Inside the consumer only the typed value
travels.

The dict carries ``version`` (:data:`VERSION`). A dict without one was written before the state
was versioned: the same fields, with a rank that had finished its share of a dealt epoch written as
position ``-1``; it reads unchanged. A version newer than this code's is refused with the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Mapping, Sequence, Union

from data_service.errors import ConfigError

VERSION = 1
WORLDS = "earlier_worlds"
_FINISHED_BEFORE_VERSIONS = -1  # how a rank that finished its share was written before ``version``


class Remainder(str, Enum):
    """What happens to the last batches of an epoch that do not divide among the ranks."""

    DROP = "drop"  # leave them out: every rank the same count
    PAD = "pad"  # wrap round to the epoch's first batches

    @classmethod
    def parse(cls, value: "str | Remainder") -> "Remainder":
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"remainder={value!r} must be 'drop' or 'pad'") from None


@dataclass(frozen=True)
class EarlierWorld:
    """One world (number of data-parallel ranks) that trained part of an epoch before it was dealt
    again. ``positions[r]`` is how many batches of its share rank ``r`` trained, or None when it had
    finished its share (its state already pointed at the next epoch)."""

    dp_size: int
    positions: tuple[int | None, ...]
    remainder: Remainder = Remainder.DROP

    def __post_init__(self) -> None:
        if not isinstance(self.dp_size, int) or self.dp_size < 1:
            raise ConfigError(f"an earlier world's dp_size={self.dp_size!r} must be an int >= 1; the state is damaged")
        if len(self.positions) != self.dp_size:
            raise ConfigError(f"an earlier world of dp_size={self.dp_size} lists {len(self.positions)} positions; "
                              "the state is damaged")
        bad = [p for p in self.positions if p is not None and (not isinstance(p, int) or p < 0)]
        if bad:
            raise ConfigError(f"an earlier world's positions {list(self.positions)} hold {bad}: positions are "
                              "ints >= 0 (or None: the rank finished its share); the state is damaged")

    def done(self, full: int) -> list[int]:
        """Each rank's trained count, a finished rank counted as its whole share of ``full``."""
        return [full if p is None else p for p in self.positions]

    def to_dict(self) -> dict[str, Any]:
        return {"dp_size": self.dp_size, "positions": list(self.positions), "remainder": self.remainder.value}

    @classmethod
    def from_dict(cls, world: Any) -> "EarlierWorld":
        if isinstance(world, EarlierWorld):
            return world
        if not isinstance(world, Mapping) or "dp_size" not in world or "positions" not in world:
            raise ConfigError(f"earlier world {world!r} lacks dp_size or positions; the state is damaged")
        positions = tuple(None if p is None or int(p) == _FINISHED_BEFORE_VERSIONS else int(p)
                          for p in world["positions"])
        return cls(int(world["dp_size"]), positions, Remainder.parse(world.get("remainder", "drop")))


@dataclass(frozen=True)
class ResumeState:
    """Where a consumer's next iteration starts: as of the last batch its outermost stage yielded.

    Attributes:
        epoch: the epoch the next iteration yields.
        seed: the job's seed (a resume with another seed is refused); None where a hand-written
            state left it out.
        position: batches of this rank's share of ``epoch`` already trained.
        dp_rank, dp_size: the data-parallel position that wrote it; None in a merged resume point
            (:func:`dnn_worker.resume.resharding.merge_states`), which any rank of any world loads.
        earlier_worlds: the worlds that trained part of ``epoch`` before it was dealt to this job's
            ranks (``dnn_worker.resume.resharding``); empty for an epoch shared as usual.
    """

    epoch: int
    position: int
    seed: int | None = None
    dp_rank: int | None = None
    dp_size: int | None = None
    earlier_worlds: tuple[EarlierWorld, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("epoch", "position", "seed"):
            value = getattr(self, name)
            if name == "seed" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"resume state's {name}={value!r}, not an int >= 0; pass what state_dict() "
                                  "returned")
        if (self.dp_rank is None) != (self.dp_size is None):
            raise ConfigError(f"resume state has dp_rank={self.dp_rank} and dp_size={self.dp_size}: both or neither")
        if self.dp_size is not None and not 0 <= self.dp_rank < self.dp_size:  # type: ignore[operator]
            raise ConfigError(f"resume state's dp_rank={self.dp_rank} must be in 0..{self.dp_size - 1}")

    @property
    def dealt(self) -> bool:
        """Whether ``epoch`` was dealt again to this job's ranks (resumed on another rank count)."""
        return bool(self.earlier_worlds)

    def at(self, **changes: Any) -> "ResumeState":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The plain dict ``state_dict()`` returns: ints, lists and strings only."""
        state: dict[str, Any] = {"version": VERSION, "epoch": self.epoch, "position": self.position}
        if self.seed is not None:
            state["seed"] = self.seed
        if self.dp_size is not None:
            state["dp_rank"], state["dp_size"] = self.dp_rank, self.dp_size
        if self.earlier_worlds:
            state[WORLDS] = [w.to_dict() for w in self.earlier_worlds]
        return state

    @classmethod
    def from_dict(cls, state: Any) -> "ResumeState":
        """Parse what a ``state_dict()`` returned (this version's, or one written before versions).

        Raises:
            ConfigError: not a state, a field missing or out of range, or a newer version, naming it.
        """
        if isinstance(state, ResumeState):
            return state
        if not isinstance(state, Mapping):
            raise ConfigError(f"data state {state!r} is not a dict; pass what state_dict() returned")
        version = state.get("version", 0)
        if not isinstance(version, int) or version > VERSION:
            raise ConfigError(f"data state has version={version!r}, newer than this consumer reads ({VERSION}): "
                              "resume with the release that wrote the checkpoint, or a newer one")
        missing = [k for k in ("epoch", "position") if k not in state]
        if missing:
            raise ConfigError(f"data state {dict(state)!r} lacks {missing}; pass what state_dict() returned")
        try:
            return cls(epoch=_int(state, "epoch"), position=_int(state, "position"), seed=_int(state, "seed", None),
                       dp_rank=_int(state, "dp_rank", None), dp_size=_int(state, "dp_size", None),
                       earlier_worlds=tuple(EarlierWorld.from_dict(w) for w in state.get(WORLDS) or ()))
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"data state {dict(state)!r} cannot be read ({exc}); pass what state_dict() "
                              "returned") from exc


# What ``load_state_dict`` takes: one rank's state (as ``state_dict()`` gave it, or typed), or every
# rank's of a job with another number of data-parallel ranks.
LoadableState = Union[Mapping[str, Any], ResumeState, Sequence[Union[Mapping[str, Any], ResumeState]]]


def _int(state: Mapping[str, Any], key: str, default: Any = ...) -> Any:
    if key not in state or (state[key] is None and default is None):
        if default is ...:
            raise ValueError(f"{key} is missing")
        return default
    value = state[key]
    if isinstance(value, bool) or int(value) != value:
        raise ValueError(f"{key}={value!r} is not an int")
    return int(value)
