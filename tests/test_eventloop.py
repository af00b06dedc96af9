"""The event-loop data plane: partial writes, many idle connections, no per-connection threads."""
from __future__ import annotations

import selectors
import socket
import threading
import time

import torch
from _fault_helpers import RawBulk, next_event, wait_clean, wait_until
from conftest import TOKEN, encode
from data_service.protocol import framing
from data_service.contract.pipeline import PipelineSpec, build_batch
from data_service.server import DataServer, ServerOptions
from data_service.protocol.generated import pb
from dnn_worker import RemoteDataset

BLOB = {"size": 16, "batch_bytes": 1 << 20}


def _expected(index: int) -> bytes:
    pipe = PipelineSpec("examples.synthetic:build_blob_pipeline", BLOB).load()
    return bytes(encode(build_batch(pipe, pipe.epoch_shape(), 0, 0, index))[2])


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


def _threads() -> list[str]:
    """This process's threads but the control plane's gRPC pool (``grpc_*``: it grows with
    overlapping RPCs, up to its bound, never with data-plane connections)."""
    return [t.name for t in threading.enumerate() if not t.name.startswith("grpc")]


def test_many_idle_connections_add_no_server_or_consumer_thread(server_factory):
    server = server_factory({"size": 64, "batch_size": 8}, num_workers=1)
    before = set(_threads())
    idle = [RawBulk(server.bulk_port) for _ in range(64)]
    try:
        for raw in idle:
            assert raw.login().WhichOneof("kind") == "welcome"
        wait_until(lambda: server.active_sessions == 64, 10, "64 sessions authenticated")
        assert not set(_threads()) - before, _threads()
        seen: list[set[str]] = []
        ds = RemoteDataset([server.address], TOKEN, connect_timeout=10)
        for n, _ in enumerate(ds):
            seen.append(set(_threads()) - before)
        assert n + 1 == 8
        # The consumer reads on the iterating thread: no receive or release thread appears (at most
        # the connection attempt's own, which ends with the attempt).
        assert all(len(new) <= 1 and all(name.startswith("connect ") for name in new) for new in seen), seen
        ds.close()  # its connection, kept for a next epoch, closes now
    finally:
        for raw in idle:
            raw.close()
    wait_clean(server.address)


def test_frames_beyond_one_read_are_not_left_waiting_in_the_consumers_buffer():
    # 200 error frames arrive in one burst and the server then goes quiet. The consumer hands out
    # at most 64 events per read; the rest sit in its own buffer, where no selector sees them,
    # and must still come out at once, not when the server next sends (or hangs up).
    from _fault_helpers import FakeBulkServer, frame_bytes
    from dnn_worker.transport.connection import BulkConnection

    fake = FakeBulkServer()
    frames = b"".join(frame_bytes(pb.BulkFrame(error=pb.BatchError(ref=pb.BatchRef(index=i), kind=pb.OUT_OF_RANGE,
                                                                    message="x", sample_index=-1)))
                      for i in range(200))
    fake.serve([frames], linger_s=20)
    conn = BulkConnection("fake", "127.0.0.1", fake.port, TOKEN)
    try:
        conn.open(timeout=5)
        got = [next_event(conn, 5).batch_id.index for _ in range(200)]
        assert got == list(range(200))
    finally:
        conn.close()
        fake.close()


class _CountingSocket(socket.socket):
    """A real socket that records how many buffers each sendmsg got, and the bytes it took."""

    calls: list[int]
    sent: int

    def sendmsg(self, buffers, *args):
        buffers = list(buffers)
        self.calls.append(len(buffers))
        n = super().sendmsg(buffers, *args)
        self.sent += n
        return n


class _Host:
    """A session's host (session_host.SessionHost) that runs every call at once."""

    def __init__(self, num_batches: int, stats, flush_later=lambda s: None) -> None:
        from data_service.server.session_host import SessionSettings
        from data_service.pool.worker_pool import WorkerPool

        self.settings = SessionSettings(token=TOKEN, server_id="s", compression="", shared_memory=False,
                                        send_timeout_s=10, num_batches=num_batches)
        self.stats = stats
        self.pool = WorkerPool("{}", 1)
        self.flush_later = flush_later

    def submit(self, task) -> None:
        self.pool.submit(task)

    def cancel(self, tasks) -> None:
        self.pool.cancel(tasks)

    def shutting_down(self) -> bool:
        return False

    def count_auth_failure(self) -> None:
        pass

    def prefetch(self, batch) -> None:
        pass

    def call_soon(self, fn, *args) -> None:
        fn(*args)

    def closed(self, session) -> None:
        pass

    def want_write(self, session, on: bool) -> None:
        pass


def test_waiting_frames_go_out_in_one_sendmsg_and_partial_writes_resume_across_them():
    # Five batches wait while the socket is full; the server then writes them with as few
    # sendmsg calls as the socket takes, each write ending anywhere (inside a header, inside a
    # payload, on a frame boundary). The bytes must arrive in order, and each slot must be
    # released once its last byte is written, never before.
    from data_service.server.session import Session
    from data_service.server.stats import ServerStats
    from data_service.contract.batch_id import BatchId
    from data_service.pool.tasks import Result, Task

    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
    sock = _CountingSocket(fileno=a.detach())
    sock.calls, sock.sent = [], 0
    sock.setblocking(False)
    b.settimeout(10)
    stats = ServerStats(None)
    session = Session(_Host(5, stats), sock, "test")
    session._out.writing = True  # as if the socket were full: frames wait in order
    released: list[tuple[int, int]] = []  # (batch, bytes the socket had taken then)
    expected = bytearray()
    ends = []
    for i in range(5):
        payload = bytes([i + 1]) * (20_000 + 7 * i)
        header = pb.BatchHeader(ref=pb.BatchRef(index=i), payload_bytes=len(payload), raw_bytes=len(payload))
        result = Result(Task(BatchId(0, 0, i), lambda _: None), header.SerializeToString(), memoryview(payload),
                        payload_bytes=len(payload), raw_bytes=len(payload),
                        _release=lambda i=i: released.append((i, sock.sent)))
        session._deliver(result)
        expected += framing.batch_frame(header.SerializeToString()) + payload
        ends.append(len(expected))
    got = bytearray()
    try:
        while len(got) < len(expected):
            session._flush()
            got += b.recv(5_000)
        session._flush()
    finally:
        b.close()
        session.close()
    assert bytes(got) == bytes(expected)
    assert [i for i, _ in released] == [0, 1, 2, 3, 4]
    early = [(i, sent, ends[i]) for i, sent in released if sent < ends[i]]
    assert not early, f"slots released before their last byte was written (batch, written, frame end): {early}"
    assert stats.batches_sent == 5 and stats.bytes_sent == len(expected)
    assert max(sock.calls) >= 4, f"no sendmsg carried two whole frames: {sock.calls}"


def test_batches_finished_in_one_loop_turn_leave_in_one_sendmsg():
    # A worker message that carries several finished batches (or several workers' messages
    # read in one turn) must reach the consumer in one write, not one per batch: each write
    # to a loopback socket wakes the consumer once more.
    from data_service.server.session import Session
    from data_service.server.stats import ServerStats
    from data_service.contract.batch_id import BatchId
    from data_service.pool.tasks import Result, Task

    a, b = socket.socketpair()
    sock = _CountingSocket(fileno=a.detach())
    sock.calls, sock.sent = [], 0
    sock.setblocking(False)
    b.settimeout(10)
    due: list = []
    session = Session(_Host(3, ServerStats(None), flush_later=due.append), sock, "test")
    expected = bytearray()
    try:
        for i in range(3):
            payload = bytes([i + 1]) * 1_000
            header = pb.BatchHeader(ref=pb.BatchRef(index=i), payload_bytes=len(payload), raw_bytes=len(payload))
            session._deliver(Result(Task(BatchId(0, 0, i), lambda _: None), header.SerializeToString(),
                                    memoryview(payload), payload_bytes=len(payload), raw_bytes=len(payload),
                                    _release=lambda: None))
            expected += framing.batch_frame(header.SerializeToString()) + payload
        assert sock.calls == [], f"written before the loop's turn ended: {sock.calls}"
        assert due == [session], f"the session must be flushed once at the end of the turn: {due}"
        session.flush()
        got = bytearray()
        while len(got) < len(expected):
            got += b.recv(1 << 16)
    finally:
        b.close()
        session.close()
    assert bytes(got) == bytes(expected)
    assert sock.calls == [6], f"three batches took {len(sock.calls)} sendmsg calls: {sock.calls}"


def test_batches_split_across_reads_at_any_byte_arrive_whole():
    # The consumer stops reading at a short read and picks up where it stopped when the next
    # bytes come: headers and payloads cut at odd places, with pauses between the pieces.
    from _fault_helpers import FakeBulkServer
    from dnn_worker.transport.connection import BulkConnection

    stream = bytearray()
    payloads = []
    for i in range(6):
        payload = bytes((i * 7 + k) % 251 for k in range(3_000 + 1_111 * i))
        s, metas, raw = encode(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        header = pb.BatchHeader(ref=pb.BatchRef(index=i), structure=s, tensors=metas, payload_bytes=len(raw),
                                raw_bytes=len(raw))
        stream += framing.batch_frame(header.SerializeToString()) + bytes(raw)
        payloads.append(payload)
    cuts = [0, 3, 9, 50, 2_000, 4_100, 4_101, 9_000, 15_000, len(stream) - 1, len(stream)]
    chunks = [bytes(stream[x:y]) for x, y in zip(cuts, cuts[1:])]
    fake = FakeBulkServer()
    fake.serve(chunks, linger_s=10, pause_s=0.02)
    conn = BulkConnection("fake", "127.0.0.1", fake.port, TOKEN, shared_memory=False)
    try:
        conn.open(timeout=5)
        for i in range(6):
            event = next_event(conn, 5)
            assert event.kind == "batch", event
            assert event.batch_id.index == i and bytes(event.batch.numpy()) == payloads[i], f"batch {i} arrived corrupted"
    finally:
        conn.close()
        fake.close()


def test_the_rest_of_a_large_payload_costs_one_wake_up_and_small_frames_after_it_are_not_held(monkeypatch):
    # A batch of 2 MB + 128 KB trickles in as 35 segments. The consumer asks the kernel to
    # report the socket only once the rest of the payload is there (SO_RCVLOWAT, at most a
    # quarter of the 8 MB receive buffer), so it is woken a few times, not once per segment.
    # The mark never stays above what is still to come (the last 64 KB or so), and goes back
    # to one byte after the payload, or the small batch behind it would wait. Only the selector
    # is watched here: no fallback read; the fake server keeps the connection open, no FIN.
    monkeypatch.setenv("HETERO_SOCKBUF", str(4 << 20))  # read by framing.tune when the consumer connects
    from _fault_helpers import FakeBulkServer
    from dnn_worker.transport.connection import BulkConnection

    def frame(index: int, payload: bytes) -> bytes:
        s, metas, raw = encode(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        header = pb.BatchHeader(ref=pb.BatchRef(index=index), structure=s, tensors=metas, payload_bytes=len(raw),
                                raw_bytes=len(raw))
        return framing.batch_frame(header.SerializeToString()) + bytes(raw)

    big, small = bytes(range(256)) * (8 << 10) + b"r" * (128 << 10), b"tail" * 256
    stream = frame(0, big)
    step = 64 << 10
    chunks = [stream[x:x + step] for x in range(0, len(stream), step)] + [frame(1, small)]
    fake = FakeBulkServer()
    fake.serve(chunks, linger_s=15, pause_s=0.01)
    conn = BulkConnection("fake", "127.0.0.1", fake.port, TOKEN, shared_memory=False, max_batch_bytes=4 << 20)
    try:
        conn.open(timeout=5)
        events, wakes, wakes_for_big = [], 0, 0
        with selectors.DefaultSelector() as sel:
            sel.register(conn, selectors.EVENT_READ)
            while len(events) < 2:
                assert sel.select(5), f"stalled after {wakes} wake-ups with {len(events)} batches read"
                wakes += 1
                events += conn.read_events()
                wakes_for_big = wakes_for_big or (wakes if events else 0)
        assert wakes_for_big <= 8, f"woken {wakes_for_big} times for one payload sent in {len(chunks) - 1} pieces"
        assert [e.kind for e in events] == ["batch", "batch"]
        assert bytes(events[0].batch.numpy()) == big and bytes(events[1].batch.numpy()) == small
    finally:
        conn.close()
        fake.close()


def test_a_batch_frame_built_from_header_bytes_equals_the_serialized_frame():
    # The server wraps the worker's header bytes without parsing them; shared-memory fields are
    # appended and must read back merged into the one header.
    header = pb.BatchHeader(ref=pb.BatchRef(seed=1, epoch=2, index=3), payload_bytes=70_000, raw_bytes=70_000,
                            tensors=[pb.TensorMeta(name="x" * 300, dtype="uint8", shape=[70_000], nbytes=70_000)])
    raw = header.SerializeToString()
    assert framing.batch_frame(raw) == framing._LEN.pack(len(pb.BulkFrame(batch=header).SerializeToString())) + \
        pb.BulkFrame(batch=header).SerializeToString()
    extra = pb.BatchHeader(shm_path="/proc/1/fd/9", shm_size=1 << 20, shm_inode=77, shm_lease=True)
    frame = framing.batch_frame(raw, extra.SerializeToString())
    parsed = pb.BulkFrame.FromString(frame[framing._LEN.size:])
    merged = pb.BatchHeader()
    merged.CopyFrom(header)
    merged.MergeFrom(extra)
    assert framing._LEN.unpack_from(frame)[0] == len(frame) - framing._LEN.size
    assert parsed.WhichOneof("kind") == "batch" and parsed.batch == merged


def test_a_server_that_accepts_but_never_answers_delays_no_other_servers_batches(server_factory):
    # A hung data server: its control plane answers Hello, but its data-plane port only accepts
    # (the kernel's backlog) and never sends the challenge. Connecting to it must not stall the
    # loop that reads the healthy server's batches: every attempt waits up to 5 s for the handshake.
    from concurrent import futures

    import grpc

    from data_service.protocol.generated import pb_grpc
    from dnn_worker import ControlClient

    healthy = server_factory({"size": 160, "batch_size": 4}, num_workers=1)
    with ControlClient(healthy.address, TOKEN) as ctl:
        info = ctl.hello()
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(64)  # never accepted: connects complete, nothing is ever sent

    class Hung(pb_grpc.DataServiceServicer):
        def Hello(self, request, context):
            reply = pb.HelloResponse()
            reply.CopyFrom(info)
            reply.bulk_port = mute.getsockname()[1]
            return reply

    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_DataServiceServicer_to_server(Hung(), grpc_server)
    hung = f"127.0.0.1:{grpc_server.add_insecure_port('127.0.0.1:0')}"
    grpc_server.start()
    try:
        ds = RemoteDataset([hung, healthy.address], TOKEN, connect_timeout=30)
        start = last = time.monotonic()
        gaps = []
        for _ in ds:
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        assert len(gaps) == 40
        assert max(gaps) < 2.5, f"a batch waited {max(gaps):.1f} s behind the hung server's handshake"
        assert time.monotonic() - start < 10
    finally:
        grpc_server.stop(0)
        mute.close()
