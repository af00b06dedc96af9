"""Ports for servers started on one machine, and what a server that fails to start says."""
from __future__ import annotations

import socket

import pytest

from hetero import ports
from hetero.testing.processes import ServerProc


def test_free_ports_are_below_the_ephemeral_range_bindable_and_not_repeated():
    span = ports._below_ephemeral()
    if span is None:
        pytest.skip(f"{ports._EPHEMERAL_RANGE} cannot be read here")
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    assert all(span[0] <= p <= span[1] for p in got), (span, got)
    with socket.socket() as s:
        s.bind(("127.0.0.1", got[-1]))


def test_without_a_known_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(ports, "_EPHEMERAL_RANGE", "/nonexistent/ip_local_port_range")
    assert ports._below_ephemeral() is None
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.slow
def test_a_server_that_cannot_start_says_why_without_a_log_file():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        server = ServerProc({"size": 8, "batch_size": 4}, bulk_port=taken.getsockname()[1])
        with pytest.raises(RuntimeError, match="cannot listen on 127.0.0.1:.*pick another --bulk-port"):
            server.start(timeout=60)
