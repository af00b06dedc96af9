"""The event-loop data plane: partial writes, many idle connections, no per-connection threads."""
from __future__ import annotations

import socket
import threading
import time

from _fault_helpers import RawBulk, wait_clean, wait_until
from conftest import TOKEN
from data_service import codec, framing
from data_service.pipeline import PipelineSpec, build_batch
from data_service.server import DataServer, ServerOptions
from data_service.wire import pb
from dnn_worker import RemoteDataset

BLOB = {"size": 16, "batch_bytes": 1 << 20}


def _expected(index: int) -> bytes:
    pipe = PipelineSpec("examples.synthetic:build_blob_pipeline", BLOB).load()
    return bytes(codec.encode(build_batch(pipe, pipe.plan_config(), 0, 0, index))[2])


def _read_slowly(sock: socket.socket, n: int, chunk: int = 32 << 10, pause: float = 0.002) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = sock.recv(min(chunk, n - len(out)))
        assert data, f"the server hung up after {len(out)} of {n} payload bytes"
        out += data
        time.sleep(pause)
    return bytes(out)


def test_partial_writes_resume_where_they_stopped_while_others_are_served(monkeypatch):
    # Socket buffers of 64 KB and a consumer that reads 32 KB at a time: every 1 MB batch leaves
    # the server's loop in many partial writes. Each must resume at the right byte, and a second
    # consumer must be served meanwhile (the loop never blocks on the slow one).
    monkeypatch.setenv("HETERO_SOCKBUF", str(64 << 10))  # read by framing.tune on every accepted socket
    server = DataServer(PipelineSpec("examples.synthetic:build_blob_pipeline", BLOB), TOKEN,
                        ServerOptions(num_workers=1, max_batch_bytes=4 << 20)).start()
    slow = RawBulk(server.bulk_port)
    box: list = []
    try:
        assert slow.login().WhichOneof("kind") == "welcome"
        slow.fetch(pb.BatchRef(seed=0, epoch=0, index=i) for i in range(4))
        other = threading.Thread(target=lambda: box.append(len(list(RemoteDataset(
            [server.address], TOKEN, shared_memory=False, connect_timeout=10, batch_timeout=20)))), daemon=True)
        other.start()
        got = {}
        for _ in range(4):
            frame = framing.recv_frame(slow.sock)
            assert frame.WhichOneof("kind") == "batch", frame
            got[frame.batch.ref.index] = _read_slowly(slow.sock, frame.batch.payload_bytes)
        other.join(60)
        assert box == [16], f"the other consumer got {box or 'nothing'} while one read slowly"
        for i in range(4):
            assert got[i] == _expected(i), f"batch {i} arrived corrupted"
        slow.close()
        wait_clean(server.address)
    finally:
        slow.close()
        server.shutdown(grace_s=2.0)


def test_many_idle_connections_add_no_server_or_consumer_thread(server_factory):
    server = server_factory({"size": 64, "batch_size": 8}, num_workers=1)
    before = threading.active_count()
    idle = [RawBulk(server.bulk_port) for _ in range(64)]
    try:
        for raw in idle:
            assert raw.login().WhichOneof("kind") == "welcome"
        wait_until(lambda: server.active_sessions == 64, 10, "64 sessions authenticated")
        assert threading.active_count() <= before + 1, [t.name for t in threading.enumerate()]
        seen: list[int] = []
        ds = RemoteDataset([server.address], TOKEN, connect_timeout=10)
        for n, _ in enumerate(ds):
            seen.append(threading.active_count())
        assert n + 1 == 8
        # The consumer reads on the iterating thread: no receive or release thread appears.
        assert max(seen) <= before + 1, (seen, before)
    finally:
        for raw in idle:
            raw.close()
    wait_clean(server.address)


def test_frames_beyond_one_read_are_not_left_waiting_in_the_consumers_buffer():
    # 200 error frames arrive in one burst and the server then goes quiet. The consumer hands out
    # at most 64 events per read; the rest sit in its own buffer, where no selector sees them,
    # and must still come out at once, not when the server next sends (or hangs up).
    from _fault_helpers import FakeBulkServer, frame_bytes
    from dnn_worker.connection import BulkConnection

    fake = FakeBulkServer()
    frames = b"".join(frame_bytes(pb.BulkFrame(error=pb.BatchError(ref=pb.BatchRef(index=i), kind=pb.OUT_OF_RANGE,
                                                                    message="x", sample_index=-1)))
                      for i in range(200))
    fake.serve([frames], linger_s=20)
    conn = BulkConnection("fake", "127.0.0.1", fake.port, TOKEN)
    try:
        conn.open(timeout=5)
        got = [conn.next_event(timeout=5).ref.index for _ in range(200)]
        assert got == list(range(200))
    finally:
        conn.close()
        fake.close()
