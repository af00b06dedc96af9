"""The data server: gRPC control plane, event-loop data plane, sessions, stats, block prefetch.

``DataServer`` (``data_server.py``) and ``ServerOptions`` (``options.py``) are its public face; the rest is the
server's own and no consumer imports it (tests/test_layering.py).
"""
from .data_server import DataServer
from .options import ServerOptions

__all__ = ["DataServer", "ServerOptions"]
