"""A data server's probe at start: batch 0 of epoch 0 built once, so a broken pipeline fails the
server in seconds, naming the sample, instead of failing every consumer later.

It also checks the batch against ``max_batch_bytes``, as it travels and, for a wire-encoded
pipeline, as the DNN nodes will decode it (they refuse a batch past the announced limit).
"""
from __future__ import annotations

import threading
import time
from multiprocessing.connection import wait as mp_wait
from typing import cast

from ..errors import ConfigError
from ..protocol.generated import pb
from ..pool.tasks import Result, Task
from ..contract.batch_id import BatchId
from ..contract.wire import WireEncoding
from ..pool.worker_pool import WorkerPool


def probe_batch(pool: WorkerPool, target: str, max_batch_bytes: int, start_timeout_s: float,
                wire_encoding: WireEncoding) -> None:
    """Build batch 0 of epoch 0 on ``pool`` (started, polled here: the data plane is not running yet).

    Raises:
        ConfigError: the pipeline fails on it, it took longer than ``start_timeout_s``, or it is (or
            decodes to) more than ``max_batch_bytes``.
    """
    done = threading.Event()
    box: list[Result] = []

    def finished(result: Result) -> None:
        box.append(result)
        done.set()

    pool.submit(Task(BatchId(0, 0, 0), finished))
    deadline = time.monotonic() + start_timeout_s
    while not done.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConfigError(f"the probe batch took longer than start_timeout_s={start_timeout_s}")
        pool.handle_ready(mp_wait(pool.wait_objects(), timeout=min(left, 0.5)))
    result = box[0]
    try:
        if result.error is not None:
            raise ConfigError(
                f"pipeline {target!r} fails on epoch 0, batch 0 "
                f"(sample {result.error.sample_index}): {result.error.message}\n{result.error.traceback}")
        size = result.raw_bytes
        if size > max_batch_bytes:
            raise ConfigError(
                f"a batch of {size} bytes exceeds max_batch_bytes={max_batch_bytes}; "
                "raise --max-batch-bytes or lower the batch size")
        if wire_encoding.encoded:  # consumers decode it under the cap
            from ..contract import tensor_layout, wire_encoding as encodings  # torch: only once the workers were spawned

            header = cast(pb.BatchHeader, result.header)  # no error: a built batch, which has one
            decoded = encodings.decoded_bytes(tensor_layout.decode(header, result.payload))
            if decoded > max_batch_bytes:
                raise ConfigError(
                    f"a batch decodes to {decoded} bytes on the DNN nodes ({size} bytes on the wire as "
                    f"{wire_encoding}), more than max_batch_bytes={max_batch_bytes}"
                    "; raise --max-batch-bytes or lower the batch size")
    finally:
        result.release()
