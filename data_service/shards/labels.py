"""How a WebDataset sample's label is read from its members: :class:`LabelRule`.

A rule names the member holding the label: ``cls`` (the default; any extension names a text
member, ``txt`` included) or ``json:FIELD`` (a field of the ``.json`` member, dotted for nested
fields). Its value is a class index when it is an integer (``3``, ``"3"``), else a class name.
Names are numbered in the order ``classes`` gives, or without it in the order they are first met
(samples are labelled in shard order, so the numbering does not depend on timing); a data set
mixing names and indices needs ``classes`` to say how they correspond.
"""
from __future__ import annotations

import json
import re
from typing import Any

from ..errors import ConfigError


class UnindexableSample(ConfigError):
    """A sample the index cannot hold (no label member, no image of a supported type, a bad label)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class LabelRule:
    """How a sample's label is read: ``cls`` / any text extension, ``txt``, or ``json:FIELD``.

    ``classes`` (names, in label order) maps class names to indices; without it, names are numbered
    as first met and integers are indices as they are.
    """

    def __init__(self, rule: str = "cls", classes: list[str] | None = None) -> None:
        kind, _, field_name = rule.partition(":")
        if not isinstance(rule, str) or not kind or (kind == "json") != bool(field_name) or "/" in kind:
            raise ConfigError(f"label={rule!r} must be a member extension holding the label (cls, txt, ...) or "
                              "json:FIELD (a field of the .json member, dotted for nested fields)")
        self.rule, self.ext, self.path = rule, kind, field_name.split(".") if field_name else []
        self.fixed = classes is not None
        self.classes = list(classes or [])
        self._ids = {name: k for k, name in enumerate(self.classes)}
        self.max_int = -1

    def label(self, raw: bytes, where: str) -> int:
        """The label of a sample whose label member holds ``raw``; UnindexableSample when it holds none."""
        value: Any  # parsed JSON: indexed by the rule's path, checked after
        try:
            value = json.loads(raw) if self.path else raw.decode("utf-8").strip()
            for part in self.path:
                value = value[part]
        except (ValueError, KeyError, TypeError, IndexError):
            raise UnindexableSample(f"{where}: its .{self.ext} member has no label by the rule {self.rule!r}",
                              f"without a label by {self.rule}") from None
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
            raise UnindexableSample(f"{where}: label {value!r} (by the rule {self.rule!r}) is neither a class index nor "
                              "a class name", "with a bad label")
        if isinstance(value, int):
            if value < 0 or (self.fixed and value >= len(self.classes)):
                span = f"0..{len(self.classes) - 1} (the classes given)" if self.fixed else "0 and up"
                raise UnindexableSample(f"{where}: class index {value} is outside {span}", "with a bad label")
            if self._ids and not self.fixed:
                raise ConfigError(f"{where}: class index {value} among class names; pass --classes to say how "
                                  "names and indices correspond")
            self.max_int = max(self.max_int, value)
            return value
        k = self._ids.get(value)
        if k is None:
            if self.fixed:
                raise UnindexableSample(f"{where}: class {value!r} is not among the classes given", "of unknown classes")
            if self.max_int >= 0:
                raise ConfigError(f"{where}: class name {value!r} among class indices; pass --classes to say how "
                                  "names and indices correspond")
            k = self._ids[value] = len(self.classes)
            self.classes.append(value)
        return k

    def final_classes(self) -> list[str]:
        if self.fixed or self.classes:
            return self.classes
        return [str(k) for k in range(self.max_int + 1)]
