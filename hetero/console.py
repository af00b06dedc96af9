"""What a ``hetero`` command shows the user besides its results: its one-line errors and its
progress bars. ``hetero.cli`` prints every error a command raises as ``hetero COMMAND: message``."""
from __future__ import annotations


class CommandError(Exception):
    """A command's one-line answer to bad input or an unreachable peer: the CLI prints
    ``hetero COMMAND: message`` on stderr and exits with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def progress_bar(total: int, desc: str, quiet: bool):
    """A bar of bytes done of the ``total`` to do, on stderr (``hetero index``; ``hetero prepare``'s
    bar counts images of its total)."""
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=quiet, mininterval=0.5)
