"""A data server's knobs (``ServerOptions``), each checked when made, naming the value and the fix."""
from __future__ import annotations

from dataclasses import dataclass

from ..contract import compression
from ..errors import ConfigError, check_integer
from ..pool.warm_start import check_start_method
from ..protocol import tls

DEFAULT_MAX_BATCH_BYTES = 1 << 30


@dataclass(frozen=True)
class ServerOptions:
    """Knobs of one data server. Every value is checked in ``__post_init__``."""

    host: str = "127.0.0.1"
    port: int = 0                 # gRPC port; 0 picks a free one
    bulk_port: int = 0            # data-plane port; 0 picks a free one
    num_workers: int = 2
    slots_per_worker: int = 4     # built batches each worker may hold: the memory bound (>= 3 lets
                                  # same-host consumers keep batches zero-copy while the worker builds ahead)
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES  # a batch's bytes, as sent and as decoded (wire_encoding)
    start_timeout_s: float = 120.0
    probe: bool = True            # build batch 0 at start-up to catch errors early
    advertise_bulk_port: int = 0  # port clients should dial for the data plane (NAT, port mapping, proxies); 0 = bulk_port
    compression: str = ""         # "" (off), "lz4" or "zstd", applied per batch by the workers
    shared_memory: bool = True    # consumers on this host read batches from shared memory, not TCP
    send_timeout_s: float = 30.0  # a consumer that takes no bytes for this long is dropped (frees its slots)
    tls_cert: str = ""            # PEM certificate: serve both planes over TLS (with tls_key)
    tls_key: str = ""
    worker_start: str = "warm"    # "warm": workers fork from a parent that imported torch and the pipeline
                                  # module (ms, shared pages); "spawn": each imports them (seconds)
    spare_worker: bool = True     # with "warm": keep one loaded worker forked ahead, to take a dead one's
                                  # place at once (its cost: an idle worker's private memory)
    worker_nice: int = 0          # raise the workers' nice value by this much (0-19): a server on cores a
                                  # trainer also uses builds in the cycles the trainer leaves, never delaying it
    batch_window_bytes: int = 0   # built batches kept for every job that asks (a sweep's jobs of one seed),
                                  # within this many bytes; 0: none, each request is built for itself
                                  # (shared_builds.py, docs/sweep.md)
    build_ahead: int | None = None  # with a batch window: the next epoch's first batches built by idle workers
                                  # before any job asks (build_ahead.py); None: a consumer's default window,
                                  # max(4, 2 x num_workers); 0: off

    def __post_init__(self) -> None:
        for name in ("port", "bulk_port"):
            check_integer(name, getattr(self, name), 0, 65535, " (a TCP port; 0 picks a free one)")
        check_integer("num_workers", self.num_workers, 1)
        check_integer("slots_per_worker", self.slots_per_worker, 1)
        if self.max_batch_bytes < 1:
            raise ConfigError(f"max_batch_bytes={self.max_batch_bytes!r} must be >= 1")
        compression.check(self.compression)
        if not self.send_timeout_s > 0:
            raise ConfigError(f"send_timeout_s={self.send_timeout_s!r} must be > 0 seconds")
        check_integer("worker_nice", self.worker_nice, 0, 19, " (0: the server's own priority)")
        check_integer("batch_window_bytes", self.batch_window_bytes, 0,
                      hint=" (bytes; 0: no batch window; hetero serve --batch-window takes sizes such as 2GB)")
        if self.build_ahead is not None:
            check_integer("build_ahead", self.build_ahead, 0, hint=" (batches; 0: off; None: max(4, 2 x num_workers))")
        check_start_method(self.worker_start)
        if not isinstance(self.spare_worker, bool):
            raise ConfigError(f"spare_worker={self.spare_worker!r} must be True or False")
        if self.tls_cert or self.tls_key:
            tls.server_files(self.tls_cert, self.tls_key)
