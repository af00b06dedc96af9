"""Batches handed out in the order the consumer asked for them, whatever order they arrive in."""
from __future__ import annotations

from typing import Any, Iterator


class InOrderBuffer:
    """Holds batches that arrived before the one the consumer waits for.

    ``next`` is the position the consumer waits for; ``put`` a batch at its position; ``ready``
    yields every batch from ``next`` on that is here, in order. ``most_held`` is the most batches
    held at once (what waiting for a slow batch cost in memory).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.next = 0
        self.most_held = 0
        self._held: dict[int, Any] = {}

    @property
    def finished(self) -> bool:
        return self.next >= self.size

    def put(self, position: int, batch: Any) -> None:
        self._held[position] = batch
        self.most_held = max(self.most_held, len(self._held))

    def ready(self) -> Iterator[tuple[int, Any]]:
        while self.next in self._held:
            position = self.next
            self.next += 1
            yield position, self._held.pop(position)
