"""``host:port`` addresses, checked once for every part that takes one (registry entries, consumers)."""
from __future__ import annotations

from ..errors import ConfigError


def split_address(address: str, what: str = "server address") -> tuple[str, int]:
    """``"10.0.0.7:6000"`` -> ``("10.0.0.7", 6000)``; ``"[::1]:6000"`` -> ``("::1", 6000)``.

    Raises:
        ConfigError: ``address`` is not ``host:port`` with a numeric port (the message names ``what``).
    """
    host, sep, port = (address if isinstance(address, str) else "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"{what} {address!r} must look like 'host:port'")
    return host.strip("[]"), int(port)
