"""How the benchmarks' consumers read: epoch after epoch, for as long as a measurement needs."""
from __future__ import annotations

from typing import Any, Iterator


def epochs(ds: Any, first: int = 0) -> Iterator[Any]:
    """Batches of epoch ``first``, ``first + 1``, ... of ``ds`` (a data set or loader with
    ``set_epoch``), without end: a small data set runs out within one measurement, and a run of
    N steps spans epochs."""
    epoch = first
    while True:
        ds.set_epoch(epoch)
        yield from ds
        epoch += 1
