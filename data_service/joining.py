"""A data server joins a running job: its registry entry, the address it gives, leaving first.

    server = DataServer(spec, token, ServerOptions(host="0.0.0.0", port=6000)).start()
    join(server, "s3://bucket/job/registry", f"{default_advertise_host()}:{server.port}")

``join`` registers the started server (``data_service.registry``) and makes its shutdown remove the
entry before it refuses new requests, then keep serving ``leave_delay_s`` while consumers notice.
"""
from __future__ import annotations

from .registry import Entry, check_uri, register, unregister


def default_advertise_host(bind_host: str = "0.0.0.0") -> str:
    """The address other machines reach this one at, for a server's registry entry.

    A specific ``bind_host`` is that address. Listening on every interface, it is the address of
    the interface the default route leaves by (an EC2 instance's or ECS task's private IP, a
    Kubernetes pod's IP), else what the host name resolves to. Pass ``--advertise-host`` where
    neither is what consumers dial (a NAT, a port mapping, a load balancer).
    """
    import socket

    if bind_host and bind_host not in ("0.0.0.0", "::", "[::]"):
        return bind_host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.254.254.254", 9))  # no packet is sent: only the route is looked up
            ip = s.getsockname()[0]
        if ip and not ip.startswith("127.") and ip != "0.0.0.0":
            return ip
    except OSError:
        pass
    try:
        ip = socket.gethostbyname(socket.gethostname())
        if not ip.startswith("127."):
            return ip
    except OSError:
        pass
    return socket.gethostname()


def join(server, uri: str, address: str, *, leave_delay_s: float = 2.0, timeout_s: float = 10.0) -> Entry:
    """Register a started ``DataServer`` at ``address`` and unregister it first when it leaves.

    The server keeps serving ``leave_delay_s`` after its entry is gone (consumers poll the
    registry about every second), then refuses new requests and finishes what it owes.

    Raises:
        ConfigError, RegistryError: see ``register``.
    """
    uri = check_uri(uri)
    entry = register(uri, server.token, server.server_id, address, server.dataset_info.fingerprint,
                     timeout_s=timeout_s, started_at=getattr(server, "created_at", None))

    def unregister_entry() -> None:
        unregister(uri, server.server_id, timeout_s=timeout_s)

    server.on_leave(unregister_entry)
    server.leave_delay_s = leave_delay_s
    return entry
