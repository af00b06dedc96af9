"""A consumer that streams a data server's batches as fast as they come, on a thread, noting when
each one arrived: the figures of a stream (rate, gaps) are read from those times."""
from __future__ import annotations

import statistics
import threading
import time


class Stream:
    """Fetches epoch after epoch of ``num_batches`` batches from ``address`` until ``stop()``."""

    def __init__(self, address: str, token: str, num_batches: int, window: int = 4) -> None:
        from data_service.contract.batch_id import BatchId
        from dnn_worker.fetch.fetch_options import FetchOptions
        from dnn_worker.fetch.fetcher import Fetcher

        refs = [BatchId(7, e, i) for e in range(400) for i in range(num_batches)]
        self._fetcher = Fetcher([address], refs, FetchOptions(token, window=window, batch_timeout=120))
        self.arrivals: list[float] = []  # time.monotonic() of each batch
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for _, batch in self._fetcher:
                self.arrivals.append(time.monotonic())
                del batch
                if self._stop.is_set():
                    break
        except BaseException as exc:  # reported by the benchmark
            self.error = exc

    def wait_first(self, timeout: float) -> float:
        """When the first batch arrived (time.monotonic())."""
        deadline = time.monotonic() + timeout
        while not self.arrivals:
            if self.error is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no batch within {timeout:.0f}s: {self.error!r}")
            time.sleep(0.005)
        return self.arrivals[0]

    def wait_after(self, moment: float, count: int, timeout: float) -> float:
        """When the ``count``-th batch after ``moment`` arrived (or ``moment + timeout``, if it did
        not): batches already built, queued or in flight when a worker died can still arrive first."""
        deadline = moment + timeout
        while time.monotonic() < deadline and self.error is None:
            after = [t for t in list(self.arrivals) if t > moment]
            if len(after) >= count:
                return after[count - 1]
            time.sleep(0.01)
        return deadline

    def count(self, since: float, until: float) -> int:
        return sum(1 for t in list(self.arrivals) if since <= t < until)

    def median_gap(self, since: float, until: float) -> float:
        times = [t for t in list(self.arrivals) if since <= t < until]
        return statistics.median(b - a for a, b in zip(times, times[1:])) if len(times) > 2 else float("nan")

    def longest_gap_after(self, moment: float, until: float) -> float:
        """The longest gap between two batches from the last one before ``moment`` to ``until``."""
        times = list(self.arrivals)
        before = [t for t in times if t <= moment]
        times = ([before[-1]] if before else []) + [t for t in times if moment < t <= until]
        return max((b - a for a, b in zip(times, times[1:])), default=float("nan"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
