"""A control client waiting for a data server that is still starting tries again every fraction of
a second, not on gRPC's growing reconnect backoff (1 s, 2.6 s, 5.2 s, ... after the first try)."""
from __future__ import annotations

import socket
import threading
import time

from dnn_worker.transport.control import ControlClient


def test_a_waiting_client_reconnects_often_while_its_server_is_not_up():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.1)
    attempts = []
    stop = threading.Event()

    def refuse():  # a port that takes connections and drops them: every try of the client counts
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            attempts.append(time.monotonic())
            conn.close()

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    try:
        with ControlClient(f"127.0.0.1:{listener.getsockname()[1]}", "t" * 32) as ctl:
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                assert not ctl.healthy(timeout=0.2)
                time.sleep(0.05)
    finally:
        stop.set()
        thread.join(2.0)
        listener.close()
    # gRPC's default backoff allows 2 or 3 tries in 2 s; the client's at most 0.25 s apart, 8
    assert len(attempts) >= 5, f"{len(attempts)} connection attempts in 2 s"
