"""How the benchmarks report figures: the date and command they were taken with, medians of
repeated runs, and the JSON file a run writes beside what it prints."""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterable

STAMP = "%Y-%m-%d %H:%M UTC"


def stamp(fmt: str = STAMP) -> str:
    """The time now, in UTC, as the figures' date (``fmt``: a ``time.strftime`` format)."""
    return time.strftime(fmt, time.gmtime())


def command(prog: str, argv: list[str] | None = None) -> str:
    """The command line that produced the figures: ``prog`` and the arguments given (``argv``,
    or this process's own when None)."""
    return " ".join([prog, *(sys.argv[1:] if argv is None else argv)])


def medians(rows: list[dict], keys: Iterable[str] | None = None) -> dict[str, float]:
    """The median of each of ``keys`` (default: every key of the first row) over ``rows``."""
    return {k: statistics.median(r[k] for r in rows) for k in (rows[0] if keys is None else keys)}


def write_json(path: str | Path | None, figures: Any, indent: int = 2, default=None, end: str = "") -> None:
    """Write ``figures`` as JSON to ``path`` (nothing when ``path`` is empty), creating its folder;
    ``default`` turns what JSON cannot hold into something it can, ``end`` follows the text."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(figures, indent=indent, default=default) + end)
