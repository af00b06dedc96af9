"""A loopback TCP proxy for fault tests (delay, cut after N bytes, cut now, stall).

One implementation serves the tests and the soak benchmark: ``benchmarks.soak.FaultProxy``.
"""
from benchmarks.soak import FaultProxy as Proxy

__all__ = ["Proxy"]
