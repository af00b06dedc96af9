"""Modules that record each process importing them: a line with its pid in ``$HETERO_TEST_IMPORT_MARKS/<module>``."""
from __future__ import annotations

import os
from pathlib import Path

VAR = "HETERO_TEST_IMPORT_MARKS"


def mark(module: str) -> None:
    folder = os.environ.get(VAR)
    if folder:
        with open(Path(folder) / module, "a") as f:
            f.write(f"{os.getpid()}\n")


def importers(folder: Path, module: str) -> list[int]:
    """The pids that imported ``module``, in order."""
    path = Path(folder) / module
    return [int(line) for line in path.read_text().split()] if path.exists() else []
