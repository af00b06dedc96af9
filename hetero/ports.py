"""Free TCP ports on the loopback interface, for servers started on one machine.

A port the kernel picks for ``bind(0)`` comes from its ephemeral range, the same range every
outgoing connection on the machine draws its local port from: between choosing such a port and
the server binding it, a client connecting anywhere may take it, and the server fails to start.
So ports are chosen below that range, where only listeners that ask for a port by number go, and
one process never hands out the same port twice in a row.
"""
from __future__ import annotations

import collections
import random
import socket
import threading

_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000          # below this, ports named services often use
_ATTEMPTS = 200
_recent: collections.deque[int] = collections.deque(maxlen=1024)  # handed out by this process
_lock = threading.Lock()
_random = random.SystemRandom()


def _below_ephemeral() -> tuple[int, int] | None:
    """``(lowest, highest)`` ports below the kernel's ephemeral range, or None where it is not known."""
    try:
        with open(_EPHEMERAL_RANGE) as f:
            first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (_LOWEST, first - 1) if first - 1 - _LOWEST >= 1000 else None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, outside the range the kernel gives outgoing
    connections where that range is known (another process may still take it, so callers bind soon
    after)."""
    span = _below_ephemeral()
    with _lock:
        if span is not None:
            for _ in range(_ATTEMPTS):
                port = _random.randint(*span)
                if port not in _recent and _bindable(port):
                    _recent.append(port)
                    return port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        _recent.append(port)
        return port
