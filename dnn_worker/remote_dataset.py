"""``RemoteDataset``: batches from data servers as a torch IterableDataset.

    loader = DataLoader(RemoteDataset(["algo-1:6000"], token=tok, seed=1),
                        batch_size=None, num_workers=2, pin_memory=True,
                        multiprocessing_context="forkserver")
    for epoch in range(3):
        loader.dataset.set_epoch(epoch)
        for batch in loader: ...

Use "forkserver" (or "spawn") for loader workers: once this process has made a gRPC
call (``len(ds)``, ``finish_stage()``), a plain fork() child can deadlock in gRPC.
For resumable training wrap the loader in ``ResumableLoader`` (docs/consumer.md).

Servers that join a running job: ``RemoteDataset(servers, token, registry="s3://bucket/job/registry")``
(or ``RemoteDataset(registry=..., token=...)`` with no server list) also uses every server registered there that proves the token and runs
the job's pipeline, from about a second after it registers (docs/elastic.md).
"""
from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any, Iterator, Sequence, cast

import grpc

from data_service.contract import wire_encoding
from data_service.contract.batch_id import BatchId
from data_service.protocol.addresses import split_address
from data_service.errors import ConfigError, DataServiceError, ServerUnavailableError
from data_service.membership.registry import check_uri
from data_service.storage import is_s3_url
from data_service.protocol.generated import pb

from .fetch.affinity import Affinity
from .resume.batch_list import BatchList
from .transport.control import ControlClient
from .fetch.fetch_options import FetchOptions
from .fetch.fetcher import Fetcher
from .fetch.registry_watch import RegistryWatcher, watcher_for
from .resume.sharding import ShardedBatches

SMALL_WINDOW = 8  # default window for batches of at most 1 MB (scheduler.SMALL_BATCH_BYTES)
# How long an epoch's connections stay open for the next epoch's iteration: reconnecting costs an
# epoch's start tens of milliseconds (a gRPC Hello, a TCP handshake); a job that does not come back
# within this (evaluating, saving, done) closes them, so its data servers see it gone (data_service/server/lifetime.py).
KEEP_OPEN_S = 10.0
HELLO_MIN_S = 0.1  # the shortest a Hello may take once the deadline is (almost) up: one round trip


class RemoteDataset(ShardedBatches):
    """Yields this rank's batches of the current epoch from one or more data servers.

    Args:
        servers: ``host:port`` addresses (or one string, comma separated); None or empty with a
            ``registry``: every server comes from the registry.
        token: the job token (the servers refuse anything else).
        window: outstanding requests per server per loader worker (default: each server's
            own, from its worker processes: docs/consumer.md).
        connect_timeout: the longest the consumer waits while no server is usable: for a first
            server's Hello, and at any time of an epoch; then ``ServerUnavailableError``.
        batch_timeout: the longest a server may owe batches without delivering one; it is then
            dropped, its batches asked of others, and each counts a failed attempt.
        batch_attempts: failed attempts in a row after which a batch ends the iteration with
            ``BatchFailedError`` naming it, the servers tried and the checksums seen (default 3;
            docs/consumer.md, "Deadlines and retries").
        pin_memory: receive straight into pinned host memory.
        shared_memory: take batches through shared memory from servers on this host (chosen
            automatically; False forces TCP).
        tls_ca: CA bundle (PEM) for servers started with a TLS certificate; tls_server_name
            overrides the name checked in their certificates.
        registry: a registry of data servers that join and leave (a folder or
            ``s3://bucket/prefix``, see ``data_service.membership.registry``), polled every ``registry_poll_s``
            (default: 0.5 s for a folder, 1 s for S3, where each poll is a LIST request).
        fingerprint: the pipeline fingerprint servers must run (default: the fixed servers', or,
            with none, that of the oldest server in the registry that proves the token).
        **kwargs: seed, rank, world_size, dp_rank, dp_size, remainder, audit_path
            (see ``ShardedBatches``).
    """

    def __init__(self, servers: str | Sequence[str] | None = None, token: str = "", *, window: int | None = None,
                 connect_timeout: float = 60.0, batch_timeout: float = 300.0, batch_attempts: int = 3,
                 pin_memory: bool = False, max_batch_bytes: int = 1 << 40, shared_memory: bool = True,
                 tls_ca: str = "", tls_server_name: str = "", registry: str | None = None,
                 registry_poll_s: float | None = None, fingerprint: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(servers, str):
            servers = [s.strip() for s in servers.split(",") if s.strip()]
        self.servers = list(servers or [])
        self.registry = check_uri(registry) if registry else None
        if not self.servers and not self.registry:
            raise ConfigError("servers=[] : give at least one data server address 'host:port', or registry=")
        if registry_poll_s is None:
            registry_poll_s = 1.0 if self.registry and is_s3_url(self.registry) else 0.5
        if not registry_poll_s > 0:
            raise ConfigError(f"registry_poll_s={registry_poll_s!r} must be > 0 seconds")
        self.registry_poll_s = float(registry_poll_s)
        self.fingerprint = fingerprint or None
        for address in self.servers:
            split_address(address)
        # every fetch option checked here, once; each epoch's Fetcher takes a copy naming this
        # process (``client_id``) and the servers' pipeline
        self.options = FetchOptions(token, window=window, small_window=0 if window else SMALL_WINDOW,
                                    connect_timeout=connect_timeout, batch_timeout=batch_timeout,
                                    batch_attempts=batch_attempts, pin_memory=pin_memory,
                                    max_batch_bytes=max_batch_bytes, shared_memory=shared_memory, tls_ca=tls_ca,
                                    tls_server_name=tls_server_name)
        self._info: pb.HelloResponse | None = None
        self._fetcher: Fetcher | None = None  # the last epoch's, its connections open for a while (KEEP_OPEN_S)

    @property
    def fetcher(self) -> Fetcher | None:
        """The ``Fetcher`` of the epoch in progress, or of the last one (None before the first):
        its ``servers``, ``stats()``, ``hedges`` and ``failovers`` say how batches were fetched."""
        return self._fetcher

    def close(self) -> None:
        """Close the connections the last epoch left open for the next one now (they close by
        themselves ``KEEP_OPEN_S`` after it): training is over, the servers may see this job gone."""
        if self._fetcher is not None:
            self._fetcher.close_kept()

    def hello(self) -> pb.HelloResponse:
        """Dataset facts from the first server that answers (cached)."""
        if self._info is None:
            if self.servers:
                info = first_hello(self.servers, self.options)
            else:  # no servers: __init__ made sure of a registry
                info = registry_hello(cast(RegistryWatcher, self._watcher()), self.fingerprint, self.options)
            if self.fingerprint and info.dataset.fingerprint != self.fingerprint:
                raise ConfigError(f"data server {info.server_id} runs pipeline {info.dataset.pipeline!r} with "
                                  f"fingerprint {info.dataset.fingerprint}, not fingerprint={self.fingerprint}: start "
                                  "the data servers with the job's pipeline and options")
            # a consumer that cannot decode the servers' wire encoding stops here, before any batch
            wire_encoding.check_decoder(wire_encoding.parse(info.dataset.wire_encoding))
            self._info = info
        return self._info

    def _watcher(self) -> "RegistryWatcher | None":
        """This process's watcher of the registry (None without one), told the job's fingerprint."""
        if not self.registry:
            return None
        watcher = watcher_for(self.registry, self.options.token, self.registry_poll_s)
        fp = self.fingerprint or (self._info.dataset.fingerprint if self._info is not None else None)
        if fp:
            watcher.set_fingerprint(fp)
        return watcher

    def __getstate__(self) -> dict:
        # DataLoader workers get a pickled copy: carry the cached Hello as bytes (protobuf
        # messages do not pickle across spawn/forkserver), so workers need no extra call.
        state = dict(self.__dict__)
        info = state.pop("_info")
        state["_info_bytes"] = info.SerializeToString() if info is not None else None
        state.update(_carry={}, _fetcher=None)
        return state

    def __setstate__(self, state: dict) -> None:
        raw = state.pop("_info_bytes", None)
        self.__dict__.update(state)
        self._info = pb.HelloResponse.FromString(raw) if raw is not None else None

    def finish_stage(self):
        """The pipeline's device-side finish stage (for ``DeviceFeeder``), from the servers' Hello."""
        from .device.feeder import finish_from_info

        return finish_from_info(self.hello().dataset)

    def num_batches_per_epoch(self) -> int:
        d = self.hello().dataset
        full, rest = divmod(d.num_samples, d.batch_size)
        return full + (1 if rest and not d.drop_last else 0)

    def _batches(self, items: BatchList) -> Iterator[tuple[BatchId, Any]]:
        info = self.hello()
        # Connections stay open for the next epoch (for KEEP_OPEN_S) unless this is the last epoch
        # of those training said it will run (``epochs``); they close with an epoch left early.
        keep = bool(items) and (items[-1].epoch != self.epoch or self.epochs is None)
        previous, self._fetcher = self._fetcher, None
        options = dataclasses.replace(self.options, client_id=client_id(self.dp_rank),
                                      fingerprint=info.dataset.fingerprint)
        # ``items`` is computed per batch as the scheduler reaches it: nothing is built per batch of the epoch
        fetcher = Fetcher(self.servers, items, options, affinity=Affinity.of(info.dataset), registry=self._watcher(),
                          keep_open=keep, reuse=previous)
        if previous is not None:
            previous.close()  # a no-op when taken over; else nothing is left open
        self._fetcher = fetcher
        yield from fetcher
        fetcher.linger(KEEP_OPEN_S)


def client_id(rank: int) -> str:
    return f"{socket.gethostname()}/rank{rank}/pid{os.getpid()}"


def first_hello(servers: Sequence[str], options: FetchOptions) -> pb.HelloResponse:
    """Hello to each server in turn until one answers; ``options.connect_timeout`` covers all of them."""
    deadline_s = options.connect_timeout
    start = time.monotonic()
    errors: dict[str, str] = {}
    while True:
        for address in servers:
            left = deadline_s - (time.monotonic() - start)
            if left <= 0 and errors:  # the deadline passed during this round: the rest are not waited for
                errors.setdefault(address, "not asked: connect_timeout ran out first")
                continue
            with ControlClient(address, options.token, client_id(0), options.tls_ca, options.tls_server_name) as ctl:
                try:  # a server that accepts and never answers costs at most what is left of the deadline
                    return ctl.hello(timeout=min(2.0, max(HELLO_MIN_S, left)))
                except grpc.RpcError as err:
                    errors[address] = f"{err.code().name}: {err.details()}"
        waited = time.monotonic() - start
        if waited > deadline_s:
            tried = "; ".join(f"{a} ({e})" for a, e in errors.items())
            raise ServerUnavailableError(
                f"no data server answered within {waited:.1f}s (connect_timeout={deadline_s}s); tried {tried}. "
                "Check the addresses and that `hetero serve` runs there")
        time.sleep(0.25)


def registry_hello(watcher: RegistryWatcher, fingerprint: str | None, options: FetchOptions) -> pb.HelloResponse:
    """Hello to the registry's servers that prove the token (of ``fingerprint``, or any: the oldest
    first) until one answers with the fingerprint its entry claims; ``options.connect_timeout``
    covers the wait for the registry too."""
    deadline_s = options.connect_timeout
    start = time.monotonic()
    errors: dict[str, str] = {}
    reads = 0
    while True:
        watcher.wait_read(reads, timeout=max(0.0, min(2.0, deadline_s - (time.monotonic() - start))))
        reads = watcher.reads
        for entry in watcher.proved():
            if fingerprint and entry.fingerprint != fingerprint:
                continue
            if deadline_s - (time.monotonic() - start) <= 0 and errors:
                break  # the deadline passed during this round: the rest are not waited for
            with ControlClient(entry.address, watcher.token, client_id(0), options.tls_ca,
                               options.tls_server_name) as ctl:
                try:
                    info = ctl.hello(timeout=min(2.0, max(HELLO_MIN_S, deadline_s - (time.monotonic() - start))))
                except (grpc.RpcError, DataServiceError) as err:
                    errors[entry.address] = f"{err.code().name}: {err.details()}" if isinstance(
                        err, grpc.RpcError) else str(err)
                    continue
            if info.dataset.fingerprint == entry.fingerprint and not info.shutting_down:
                return info
            errors[entry.address] = ("shutting down" if info.shutting_down else
                                     f"its entry says fingerprint {entry.fingerprint}, it runs {info.dataset.fingerprint}")
        waited = time.monotonic() - start
        if waited > deadline_s:
            state = f"cannot be read ({watcher.error})" if watcher.error else "has no usable server"
            tried = "; ".join(f"{a} ({e})" for a, e in errors.items()) or "none"
            raise ServerUnavailableError(
                f"no data server from registry {watcher.uri} answered within {waited:.1f}s "
                f"(connect_timeout={deadline_s}s): the registry {state}; tried {tried}. Start a data server "
                f"with `hetero serve ... --join {watcher.uri}` and the job token")
        time.sleep(0.1)
