"""gRPC control calls to one data server: Hello, stats, health, shutdown."""
from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from data_service.protocol import version as protocol
from data_service.protocol.auth import VERSION_KEY, bearer
from data_service.errors import (PermissionDeniedError, ServerUnavailableError,
                                 VersionMismatchError)
from data_service.protocol.version import mismatch_message
from data_service.protocol.generated import pb, pb_grpc

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
RECONNECT_MS = 200  # a channel that could not connect tries again this often (while it is used)


class ControlClient:
    """Control-plane client for one server address ``host:port``.

    Args:
        address: the server's gRPC address.
        token: the job token.
        tls_ca: CA bundle (PEM) to verify a TLS server with; "" for plain TCP.
        tls_server_name: name to check in the server's certificate instead of the address's host.

    The version announced is ``protocol.version.PROTOCOL_VERSION``, read once here, as the data
    plane's handshake reads it: one constant says what this consumer speaks.
    """

    def __init__(self, address: str, token: str, client_id: str = "", tls_ca: str = "",
                 tls_server_name: str = "") -> None:
        self.address = address
        self.client_id = client_id
        self.client_version = protocol.PROTOCOL_VERSION
        self._metadata = (bearer(token), (VERSION_KEY, self.client_version))
        # Reconnect at most RECONNECT_MS apart: with gRPC's default backoff (1 s, then x1.6 up to
        # 120 s) a client waiting for a server that is still starting saw it up to seconds late.
        options: list[tuple[str, int | str]] = [
            ("grpc.enable_retries", 0), ("grpc.initial_reconnect_backoff_ms", RECONNECT_MS),
            ("grpc.min_reconnect_backoff_ms", RECONNECT_MS), ("grpc.max_reconnect_backoff_ms", RECONNECT_MS)]
        if tls_ca:
            from data_service.protocol.tls import _read

            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            creds = grpc.ssl_channel_credentials(root_certificates=_read(tls_ca, "tls_ca"))
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.DataServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "ControlClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _translate(self, err: grpc.RpcError):
        code = err.code()
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return PermissionDeniedError(f"server {self.address} refused the job token: {err.details()}")
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return VersionMismatchError(f"server {self.address}: {err.details()}")
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return VersionMismatchError(
                f"server {self.address} does not implement heterodata.v1: "
                + mismatch_message(self.client_version, "another major version"))
        return None

    def hello(self, timeout: float = 5.0) -> pb.HelloResponse:
        """One Hello call.

        Raises:
            PermissionDeniedError, VersionMismatchError: final answers.
            grpc.RpcError: the server is not reachable (retry).
        """
        try:
            return self._stub.Hello(pb.HelloRequest(client_version=self.client_version, client_id=self.client_id),
                                    metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as err:
            raise self._translate(err) or err

    def wait_hello(self, deadline_s: float) -> pb.HelloResponse:
        """Hello, retried while the server is unreachable, up to ``deadline_s`` seconds.

        Raises:
            ServerUnavailableError: naming the address and the seconds waited.
        """
        start = time.monotonic()
        last = "no attempt"
        while True:
            left = deadline_s - (time.monotonic() - start)
            try:
                return self.hello(timeout=max(0.2, min(5.0, left)))
            except grpc.RpcError as err:
                if err.code() not in _RETRYABLE:
                    raise
                last = f"{err.code().name}: {err.details()}"
            left = deadline_s - (time.monotonic() - start)
            if left <= 0:
                raise ServerUnavailableError(
                    f"no data server answered at {self.address} within {deadline_s:.1f}s "
                    f"(last error: {last}); check the address and that `hetero serve` runs there")
            time.sleep(min(0.25, left))

    def stats(self, timeout: float = 5.0) -> pb.Stats:
        try:
            return self._stub.GetStats(pb.StatsRequest(), metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as err:
            raise self._translate(err) or err

    def shutdown(self, grace_s: float = 30.0, reason: str = "", timeout: float = 10.0) -> bool:
        """Ask the server to stop. Returns True if it was already stopping."""
        try:
            resp = self._stub.Shutdown(pb.ShutdownRequest(grace_s=grace_s, reason=reason),
                                       metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as err:
            raise self._translate(err) or err
        return resp.already_shutting_down

    def healthy(self, timeout: float = 2.0) -> bool:
        """True when the standard health service reports SERVING."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
        return resp.status == health_pb2.HealthCheckResponse.SERVING


def refused(err: grpc.RpcError) -> bool:
    """The host answered that nothing listens on the port (a server stopped, or never started)."""
    return err.code() == grpc.StatusCode.UNAVAILABLE and "refused" in (err.details() or "").lower()


def unreachable(err: grpc.RpcError, address: str) -> ServerUnavailableError:
    """One line for a control call that reached no server at ``address``, with what to check."""
    details = (err.details() or "").split("; last error:")[-1].strip() or err.code().name
    if refused(err):
        why = "nothing listens there (the server stopped, or runs on another port)"
    elif "dns" in details.lower() or "resolv" in details.lower():
        why = "the host name does not resolve"
    else:
        why = f"{err.code().name}: {details}"
    return ServerUnavailableError(f"no data server at {address}: {why}; check the address (host:port of "
                                  "`hetero serve --port`) and that the server runs")
