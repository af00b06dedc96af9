"""Optional TLS for both planes (certificates by path).

Server: ``ServerOptions(tls_cert=..., tls_key=...)`` serves gRPC over TLS and wraps
every data-plane connection. Consumer: ``RemoteDataset(tls_ca=...)`` (and
``ControlClient(tls_ca=...)``) verifies the server against that CA bundle;
``tls_server_name`` overrides the name checked when the certificate does not
carry the host name the consumer dials (SageMaker's algo-N, say).
"""
from __future__ import annotations

import ssl
from pathlib import Path

from ..errors import ConfigError


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}={path!r} cannot be read ({exc.strerror}); give a PEM file") from None


def server_files(cert: str, key: str) -> tuple[bytes, bytes]:
    """(key PEM, cert PEM), checked to load together."""
    if bool(cert) != bool(key):
        raise ConfigError(f"give tls_cert and tls_key together (got tls_cert={cert!r}, tls_key={key!r})")
    key_pem, cert_pem = _read(key, "tls_key"), _read(cert, "tls_cert")
    server_context(cert, key)  # fails now, with the reason, if they do not match
    return key_pem, cert_pem


def server_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls_cert={cert!r} / tls_key={key!r} do not load as a certificate and its key: {exc}") from None
    return ctx


def client_context(ca: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        ctx.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls_ca={ca!r} does not load as a CA bundle: {exc}") from None
    return ctx
