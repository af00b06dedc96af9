"""Job-token checks for the gRPC control plane.

Every DataService call carries ``authorization: Bearer <token>``; the data
plane proves the token with an HMAC over a server nonce (see ``framing``).
The standard health service stays open so load balancers and the launcher can
probe it without the secret.
"""
from __future__ import annotations

import hmac

import grpc

METADATA_KEY = "authorization"
VERSION_KEY = "x-heterodata-version"
_PROTECTED_PREFIX = "/heterodata.v1.DataService/"


def bearer(token: str) -> tuple[str, str]:
    return (METADATA_KEY, f"Bearer {token}")


def token_matches(expected: str, presented: str | None) -> bool:
    return presented is not None and hmac.compare_digest(expected.encode(), presented.encode())


class TokenInterceptor(grpc.ServerInterceptor):
    """Rejects DataService calls without the job token (PERMISSION_DENIED)."""

    def __init__(self, token: str, on_failure=None) -> None:
        self._token = token
        self._on_failure = on_failure

        def deny(request, context):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          "missing or wrong job token: pass the job's token (HETERO_JOB_TOKEN)")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        if not handler_call_details.method.startswith(_PROTECTED_PREFIX):
            return continuation(handler_call_details)
        presented = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == METADATA_KEY and value.startswith("Bearer "):
                presented = value[len("Bearer "):]
        if token_matches(self._token, presented):
            return continuation(handler_call_details)
        if self._on_failure is not None:
            self._on_failure()
        return self._deny
