"""A finished connection attempt ends the consumer loop's wait at once (``data_service/protocol/waker.py``)."""
from __future__ import annotations

import selectors
import threading
import time

from conftest import TOKEN
from dnn_worker.fetch.fetch_options import FetchOptions
from dnn_worker.fetch.server_set import ServerSet
from data_service.protocol.waker import Waker

WAIT_S = 30.0  # far above any connection here: a wait that lasts it was never woken


def test_a_wake_from_another_thread_ends_the_select_and_a_drain_rearms_it():
    waker = Waker()
    sel = selectors.DefaultSelector()
    sel.register(waker, selectors.EVENT_READ, waker)
    try:
        assert sel.select(0) == []
        thread = threading.Timer(0.05, waker.wake)
        thread.start()
        assert [key.data for key, _ in sel.select(WAIT_S)] == [waker]
        thread.join()
        waker.wake()  # a second wake before the drain adds nothing to read
        waker.drain()
        assert sel.select(0) == []
    finally:
        sel.close()
        waker.close()
    waker.wake()  # a set closed meanwhile: nothing happens, nothing raises


def test_a_connection_attempt_that_finishes_ends_the_wait_and_is_taken_in_on_the_next_turn(server_factory):
    server = server_factory()
    servers = ServerSet([server.address], FetchOptions(token=TOKEN))
    try:
        assert servers.connect(time.monotonic()) == []  # the attempt starts on its own thread
        attempt = servers.servers[0].attempt
        assert attempt is not None
        started = time.monotonic()
        while not attempt.done and time.monotonic() - started < WAIT_S:
            assert servers.wait(WAIT_S) == []  # no connection yet: nothing but the wake to see
        waited = time.monotonic() - started
        assert attempt.done and waited < WAIT_S, f"the wait lasted {waited:.1f}s: the attempt never woke it"
        assert [s.address for s in servers.connect(time.monotonic())] == [server.address]
        assert servers.usable() == [server.address]
    finally:
        servers.close()
