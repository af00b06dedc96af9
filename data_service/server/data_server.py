"""The data server: gRPC control plane + TCP data plane over a worker pool.

Python API::

    server = DataServer(PipelineSpec("mypkg.data:build_pipeline", {"size": 64}),
                        token="s3cret", options=ServerOptions(num_workers=4))
    server.start()              # starts workers (they load the pipeline), builds a probe batch
    print(server.address)       # "127.0.0.1:50051": what consumers connect to
    server.wait()               # until Shutdown (RPC or server.shutdown())

Threads: gRPC's pool for the control plane and one data-plane event loop (dataplane.py) for
every consumer connection and the worker pool's pipes, however many consumers connect.
"""
from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
import uuid
from concurrent import futures
from typing import Callable, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ..protocol import tls
from ..protocol.auth import TokenInterceptor
from ..errors import ConfigError
from .dataplane import DataPlane
from .options import ServerOptions
from .probe import probe_batch
from .block_prefetch import PrefetchOnce
from ..contract.batch_id import BatchId
from ..contract.pipeline import PipelineInfo, PipelineSpec, ServerSide
from ..contract.sampler import EpochShape
from .session_host import SessionSettings
from .batch_window import BatchWindow
from .shared_builds import BatchIdentity, SharedBuilds
from .stats import ServerStats
from ..protocol.version import PROTOCOL_VERSION, compatible, mismatch_message
from ..protocol.window import default_window
from ..protocol.generated import pb, pb_grpc
from ..pool.worker_pool import WorkerPool

log = logging.getLogger(__name__)

SERVICE_NAME = "heterodata.v1.DataService"


class _Servicer(pb_grpc.DataServiceServicer):
    def __init__(self, server: "DataServer") -> None:
        self._server = server

    def Hello(self, request, context):
        if not compatible(request.client_version, PROTOCOL_VERSION):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          mismatch_message(request.client_version, PROTOCOL_VERSION))
        s = self._server
        return pb.HelloResponse(server_version=PROTOCOL_VERSION, bulk_port=s.options.advertise_bulk_port or s.bulk_port,
                                dataset=s.dataset_info, server_id=s.server_id,
                                shutting_down=s.leaving, workers=s.options.num_workers,
                                bulk_tls=bool(s.options.tls_cert))

    def GetStats(self, request, context):
        return self._server.stats.snapshot()

    def Shutdown(self, request, context):
        grace = request.grace_s if request.grace_s > 0 else 30.0
        already = self._server.shutdown(grace_s=grace, reason=request.reason or "Shutdown call", block=False)
        return pb.ShutdownResponse(already_shutting_down=already)


class DataServer:
    """Serves batches of one pipeline; see the module docstring."""

    def __init__(self, spec: PipelineSpec, token: str, options: ServerOptions | None = None) -> None:
        if not token:
            raise ConfigError("token='' : a data server needs a job token (HETERO_JOB_TOKEN or --token)")
        self.spec = spec
        self.token = token
        self.options = options or ServerOptions()
        self.server_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.created_at = time.time()  # wall clock, for a registry entry's ``started_at``
        self.pool = WorkerPool(spec.to_json(), self.options.num_workers, self.options.slots_per_worker,
                               self.options.start_timeout_s, log_level=logging.getLogger().level or logging.INFO,
                               compression=self.options.compression, nice=self.options.worker_nice,
                               worker_start=self.options.worker_start, spare=self.options.spare_worker)
        self.pool.on_no_workers = self._no_workers
        self.stats = ServerStats(self.pool)
        self.plan: EpochShape | None = None  # the pipeline's, once the workers reported it (start())
        self.dataset_info: pb.DatasetInfo | None = None
        self.port = 0
        self.bulk_port = 0
        self.shutting_down = False  # new requests are refused (SHUTTING_DOWN); in-flight ones finish
        self.leaving = False        # told to leave: ``on_leave`` callbacks run, then requests are refused
        self.leave_delay_s = 0.0    # keep serving this long after the callbacks (consumers see it gone)
        self._on_leave: list = []
        self._dataplane: DataPlane | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._grpc: grpc.Server | None = None
        self._health: health.HealthServicer | None = None
        self._listener: socket.socket | None = None
        self._tls_context: ssl.SSLContext | None = None
        self._prefetch: PrefetchOnce | None = None  # the pipeline's block prefetcher, once per block
        self._pipeline_close: Callable[[], None] | None = None
        self.shared: SharedBuilds | None = None  # the batch window, with batch_window_bytes

    @property
    def address(self) -> str:
        return f"{self.options.host}:{self.port}"

    # -- start
    def start(self) -> "DataServer":
        """Start workers (they build the pipeline and report its plan), check a probe batch, open both ports.

        The main process builds only the pipeline's :class:`~data_service.contract.pipeline.ServerSide`
        (a block prefetcher, stats, clean-up), never its data set or transforms.

        Raises:
            ConfigError: bad import path, options, batch structure or size; busy port.
        """
        # The workers start first: they import torch and load the pipeline while this process
        # imports the builder's module (a second or more each, side by side).
        self._check_ports()  # a busy port fails in milliseconds, before any worker starts
        self.pool.spawn()
        try:
            self.spec.check_options()  # the import path or an option name, before the workers report it
            declared = self.spec.server_side()  # fails here, at start-up, with the import path in the message
        except BaseException:
            self.pool.stop(0)
            raise
        side = declared or ServerSide()
        self.stats.pipeline_stats = side.stats
        self._pipeline_close = side.close
        self.pool.start(own_thread=False)  # the data-plane loop reads the workers' pipes
        try:
            info = cast(PipelineInfo, self.pool.info)  # pool.start() set it, or raised
            if declared is None and info.hooks:
                log.warning("pipeline %s sets Pipeline %s, which a data server does not call: declare the "
                            "builder's server_side (data_service.contract.pipeline.ServerSide) with them",
                            self.spec.target, " and ".join(info.hooks))
            self.plan = info.plan
            self.dataset_info = pb.DatasetInfo(
                num_samples=self.plan.num_samples, batch_size=self.plan.batch_size,
                drop_last=self.plan.drop_last, shuffle=self.plan.shuffle, pipeline=self.spec.target,
                fingerprint=self.spec.fingerprint(), max_batch_bytes=self.options.max_batch_bytes,
                finish=info.finish, finish_dtypes=dict(info.finish_dtypes), compression=self.options.compression,
                block_samples=self.plan.block_samples, interleave=self.plan.interleave,
                wire_encoding=info.wire_encoding.name)
            if side.prefetcher is not None:
                self._prefetch = PrefetchOnce(side.prefetcher, self.plan)
            if self.options.batch_window_bytes:
                # the next epoch's batches the window builds ahead: the option, else a consumer's default window
                lead = default_window(self.options.num_workers) if self.options.build_ahead is None else \
                    self.options.build_ahead
                self.shared = SharedBuilds(self.pool, BatchWindow(self.options.batch_window_bytes),
                                           BatchIdentity(self.dataset_info.fingerprint, info.wire_encoding,
                                                         self.options.compression), self.plan.num_batches,
                                           workers=self.options.num_workers, lead=lead)
                self.stats.window_figures = self.shared.figures
            if self.options.probe:
                probe_batch(self.pool, self.spec.target, self.options.max_batch_bytes,
                            self.options.start_timeout_s, info.wire_encoding)
            self._open_ports()
        except BaseException:
            self.pool.stop(0)
            raise
        log.info("data server %s serving %s (%d samples, %d batches/epoch) on %s, data plane port %d, %d workers%s",
                 self.server_id, self.spec.target, self.plan.num_samples, self.plan.num_batches,
                 self.address, self.bulk_port, self.options.num_workers,
                 f", batch window {self.options.batch_window_bytes} bytes" if self.shared is not None else "")
        return self

    def _check_ports(self) -> None:
        """A port asked for by number that another process holds: the error now, not after the
        workers built the probe batch (gRPC binds with SO_REUSEADDR, as ``_bind`` does)."""
        for port, flag in ((self.options.port, "--port"), (self.options.bulk_port, "--bulk-port")):
            if port:
                self._bind(port, flag).close()

    def _bind(self, port: int, flag: str) -> socket.socket:
        """A socket bound to ``port`` (0: a free one) on the server's host.

        Raises:
            ConfigError: the port is taken (or the host is not this machine's), naming both and ``flag``.
        """
        sock = socket.socket(socket.AF_INET6 if ":" in self.options.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.options.host, port))
        except OSError as exc:
            sock.close()
            raise self._cannot_listen(port, flag, exc.strerror or str(exc)) from None
        return sock

    def _cannot_listen(self, port: int, flag: str, why: str) -> ConfigError:
        return ConfigError(f"cannot listen on {self.options.host}:{port} ({why}); pick another {flag} or 0 for a "
                           "free one")

    def _open_ports(self) -> None:
        self._health = health.HealthServicer()
        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="grpc"),
            interceptors=[TokenInterceptor(self.token, self.count_auth_failure)],
            options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_DataServiceServicer_to_server(_Servicer(self), self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        try:
            target = f"{self.options.host}:{self.options.port}"
            if self.options.tls_cert:
                key_pem, cert_pem = tls.server_files(self.options.tls_cert, self.options.tls_key)
                self.port = self._grpc.add_secure_port(target, grpc.ssl_server_credentials([(key_pem, cert_pem)]))
                self._tls_context = tls.server_context(self.options.tls_cert, self.options.tls_key)
            else:
                self.port = self._grpc.add_insecure_port(target)
        except RuntimeError as exc:
            raise self._cannot_listen(self.options.port, "--port", str(exc)) from exc
        self._listener = self._bind(self.options.bulk_port, "--bulk-port")
        self._listener.listen(1024)
        self.bulk_port = self._listener.getsockname()[1]
        settings = SessionSettings(
            token=self.token, server_id=self.server_id, compression=self.options.compression,
            shared_memory=self.options.shared_memory, send_timeout_s=self.options.send_timeout_s,
            num_batches=cast(EpochShape, self.plan).num_batches)  # start() set it before the ports open
        self._dataplane = DataPlane(self._listener, self.pool, settings, self, self._tls_context, builds=self.shared)
        self._dataplane.start()
        self._grpc.start()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def _no_workers(self, why: str) -> None:
        """Every replacement of the last worker failed: say NOT_SERVING (requests already fail over)."""
        log.error("%s; health is NOT_SERVING", why)
        if self._health is not None:
            for name in ("", SERVICE_NAME):
                self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    def prefetch(self, batch: BatchId) -> None:
        """A consumer hints at or requests ``batch``: the pipeline's block prefetcher, if it has
        one, starts fetching the batch's blocks (once per block and epoch)."""
        if self._prefetch is not None:
            self._prefetch.batch(batch)

    def count_auth_failure(self) -> None:
        self.stats.auth_failures += 1

    @property
    def active_sessions(self) -> int:
        plane = self._dataplane
        return 0 if plane is None else sum(1 for s in plane.sessions() if s.authenticated)

    # -- stop
    def on_leave(self, callback) -> None:
        """Call ``callback()`` first when the server is told to leave, before it refuses new
        requests (a registered server unregisters here, so consumers stop asking it); it must
        return within seconds. The server then keeps serving for ``leave_delay_s``."""
        self._on_leave.append(callback)

    def shutdown(self, grace_s: float = 30.0, reason: str = "", block: bool = True) -> bool:
        """Leave: run the ``on_leave`` callbacks, stop taking new requests (consumers get
        SHUTTING_DOWN and ask another server), finish in-flight ones (up to ``grace_s``), stop.

        Idempotent. Returns True when a shutdown was already under way.
        """
        with self._lock:
            already, self.leaving = self.leaving, True
        if not already:
            log.info("data server %s shutting down (%s), grace %.0fs", self.server_id, reason or "requested", grace_s)
            if not self._on_leave:
                self._refuse()
            threading.Thread(target=self._stop, args=(grace_s,), name="shutdown", daemon=True).start()
        if block:
            self._stopped.wait(grace_s + self.leave_delay_s + 30)
        return already

    def _refuse(self) -> None:
        self.shutting_down = True
        if self._health is not None:
            self._health.enter_graceful_shutdown()

    def _leave(self, grace_s: float) -> None:
        for callback in self._on_leave:
            try:
                callback()
            except Exception as exc:  # leaving goes on: the consumers' failover covers the rest
                log.warning("data server %s: leave step %s failed: %s", self.server_id,
                            getattr(callback, "__name__", callback), exc)
        if self.leave_delay_s > 0:
            time.sleep(min(self.leave_delay_s, grace_s))
        self._refuse()

    def _stop(self, grace_s: float) -> None:
        if not self.shutting_down:
            self._leave(grace_s)
        deadline = time.monotonic() + grace_s
        plane = self._dataplane
        while plane is not None and time.monotonic() < deadline:
            try:
                busy = plane.call(lambda: any(not s.idle for s in plane.sessions()), timeout=5.0)
            except TimeoutError:
                busy = True
            if not busy:
                break
            time.sleep(0.05)
        if plane is not None:
            plane.stop(timeout=5.0)
        elif self._listener is not None:
            self._listener.close()
        self.pool.stop(timeout=5.0)
        if self.shared is not None:
            self.shared.close()
        if self._grpc is not None:
            self._grpc.stop(grace=1.0).wait(5.0)
        if self._pipeline_close is not None:
            try:
                self._pipeline_close()
            except Exception as exc:  # the server stops all the same
                log.warning("data server %s: the pipeline's close() failed: %s", self.server_id, exc)
        self._stopped.set()
        log.info("data server %s stopped", self.server_id)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped; True if it did within ``timeout``."""
        return self._stopped.wait(timeout)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def __enter__(self) -> "DataServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown(grace_s=5.0)
