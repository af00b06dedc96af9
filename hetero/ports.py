"""Free TCP ports on the loopback interface, for servers started on one machine."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the OS picks it; another process may take
    it before it is bound again, so callers bind soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
