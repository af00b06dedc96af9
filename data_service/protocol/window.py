"""A consumer's default request window: the batches it keeps asked of one server at once.

Both sides size things by it: the consumer its window at a server (``FetchOptions.window_for``,
from the worker processes the server's Hello reports), and a server with a batch window the
batches it builds ahead of an epoch's first requests (``DataServer``, build_ahead.py).
"""
from __future__ import annotations

MIN_WINDOW = 4  # at least this many, however few workers: one request in flight is not a pipeline


def default_window(workers: int) -> int:
    """2 x a server's worker processes, at least ``MIN_WINDOW``."""
    return max(MIN_WINDOW, 2 * workers)
