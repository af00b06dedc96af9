"""Bad and hostile input on both server ports, and a hostile server against the consumer.

Every case ends with the server still serving a normal consumer and its sessions cleaned up.
docs/faults.md lists the failure modes and the tests that guard them.
"""
from __future__ import annotations

import socket
import struct
import time

import grpc
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _fault_helpers import (FakeBulkServer, RawBulk, bulk_port, frame_bytes, next_event, send_frame, stats, wait_clean,
                            wait_until)
from conftest import TOKEN
from data_service.contract import tensor_layout
from data_service.protocol import framing
from data_service.errors import ProtocolError
from data_service.protocol.generated import pb, pb_grpc
from data_service.protocol.version import PROTOCOL_VERSION
from dnn_worker import RemoteDataset
from dnn_worker.transport.connection import BulkConnection
from hetero.testing import ServerProc

pytestmark = pytest.mark.timeout(240)
NUM_BATCHES = 13  # shared_server: 100 samples, batches of 8


def serves_normally(server) -> None:
    assert len(list(RemoteDataset([server.address], TOKEN, connect_timeout=10))) == NUM_BATCHES


# ------------------------------------------------------------------ job token

@pytest.mark.parametrize("metadata", [
    (),                                               # no token at all
    (("authorization", "Bearer wrong"),),
    (("authorization", "Bearer "),),
    (("authorization", TOKEN),),                      # no scheme
    (("authorization", f"Basic {TOKEN}"),),
    (("authorization", f"Bearer {TOKEN}x"),),
    (("authorization", "Bearer " + "A" * 6000),),    # long garbage
])
def test_control_calls_without_the_token_are_denied(shared_server, metadata):
    before = stats(shared_server.address).auth_failures
    with grpc.insecure_channel(shared_server.address) as ch:
        stub = pb_grpc.DataServiceStub(ch)
        for call, req in ((stub.Hello, pb.HelloRequest(client_version=PROTOCOL_VERSION)), (stub.GetStats, pb.StatsRequest()),
                          (stub.Shutdown, pb.ShutdownRequest(grace_s=1))):
            with pytest.raises(grpc.RpcError) as info:
                call(req, metadata=metadata, timeout=5)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert stats(shared_server.address).auth_failures == before + 3
    assert not shared_server.shutting_down
    serves_normally(shared_server)


@pytest.mark.parametrize("proof", [b"", b"\x00" * 32, b"x" * 31, b"y" * 5000,
                                   framing.token_proof("wrong", b"n" * 32)])
def test_data_plane_with_a_wrong_or_missing_proof_is_denied(shared_server, proof):
    raw = RawBulk(bulk_port(shared_server.address))
    try:
        raw.challenge()
        send_frame(raw.sock, pb.BulkFrame(hello=pb.BulkHello(client_version=PROTOCOL_VERSION, proof=proof)))
        reply = framing.recv_frame(raw.sock)
        assert reply.WhichOneof("kind") == "error" and reply.error.kind == pb.PERMISSION_DENIED
        assert raw.closed_by_peer()
    finally:
        raw.close()
    wait_clean(shared_server.address)
    serves_normally(shared_server)


def test_fetch_before_hello_is_refused(shared_server):
    raw = RawBulk(bulk_port(shared_server.address))
    try:
        raw.challenge()
        raw.fetch([pb.BatchRef(seed=0, epoch=0, index=0)])
        frames = []
        raw.sock.settimeout(10)
        try:
            while True:
                frame = framing.recv_frame(raw.sock)
                frames.append(frame.WhichOneof("kind"))
                assert frames[-1] != "batch", "a batch was served before authentication"
        except (framing.PeerClosed, ConnectionError):
            pass
    finally:
        raw.close()
    assert shared_server.stats.snapshot().batches_sent >= 0
    wait_clean(shared_server.address)


# ------------------------------------------------------------------ protocol versions

@pytest.mark.parametrize("version", ["2.0", "0.9", "garbage", "", "1", "1.0", "1.x", "1.1.1", "1.99", "-1.0",
                                     "99999999999999999999.0"])
def test_version_mismatch_or_garbage_on_both_planes(shared_server, version, monkeypatch):
    from data_service.protocol import version as protocol
    from dnn_worker import ControlClient

    ok = version == "1.99"  # a later minor version of the same major: compatible
    with monkeypatch.context() as m:
        m.setattr(protocol, "PROTOCOL_VERSION", version)  # what the consumer announces (the server keeps its own)
        with ControlClient(shared_server.address, TOKEN) as ctl:
            if ok:
                assert ctl.hello().server_version == PROTOCOL_VERSION
            else:
                with pytest.raises(Exception, match="version") as info:
                    ctl.hello()
                assert repr(version) in str(info.value) and repr(PROTOCOL_VERSION) in str(info.value)
                if version in ("1", "1.0"):  # same major, but it would not check the batches' CRC32C
                    assert "does not check" in str(info.value) and "CRC32C" in str(info.value)
    raw = RawBulk(bulk_port(shared_server.address))
    try:
        reply = raw.login(version=version)
        if ok:
            assert reply.WhichOneof("kind") == "welcome"
        else:
            assert reply.WhichOneof("kind") == "error" and reply.error.kind == pb.VERSION_MISMATCH
            assert repr(version) in reply.error.message
    finally:
        raw.close()
    wait_clean(shared_server.address)


# ------------------------------------------------------------------ oversized messages

@pytest.mark.parametrize("when", ["before_hello", "after_login"])
def test_a_frame_header_over_1mib_drops_the_connection_only(shared_server, when):
    raw = RawBulk(bulk_port(shared_server.address))
    try:
        if when == "before_hello":
            raw.challenge()
        else:
            assert raw.login().WhichOneof("kind") == "welcome"
        raw.sock.sendall(struct.pack("<I", framing.MAX_FRAME + 1) + b"\x00" * 64)
        assert raw.closed_by_peer(), "the server kept reading a frame over the limit"
    finally:
        raw.close()
    wait_clean(shared_server.address)
    serves_normally(shared_server)


def test_a_fetch_of_more_than_4096_outstanding_batches_is_refused_and_cancelled(server_factory):
    from data_service.server.session import MAX_OUTSTANDING

    server = server_factory({"size": 100, "batch_size": 8, "work_ms": 5}, num_workers=1)
    raw = RawBulk(bulk_port(server.address))
    try:
        assert raw.login().WhichOneof("kind") == "welcome"
        refs = [pb.BatchRef(seed=s, epoch=e, index=i) for s in range(400) for e in range(1) for i in range(13)]
        assert len(refs) > MAX_OUTSTANDING
        raw.fetch(refs)  # ~50 KB: well under the frame limit, over the outstanding limit
        assert raw.closed_by_peer(30)
    finally:
        raw.close()
    wait_clean(server.address, timeout=60)  # the 4096 queued tasks were cancelled, not built
    assert server.stats.snapshot().batches_built < 200
    assert len(list(RemoteDataset([server.address], TOKEN))) == 13


def test_an_oversized_grpc_message_is_refused(shared_server):
    with grpc.insecure_channel(shared_server.address, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        stub = pb_grpc.DataServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Hello(pb.HelloRequest(client_version=PROTOCOL_VERSION, client_id="x" * (8 << 20)),
                       metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=20)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    serves_normally(shared_server)


# ------------------------------------------------------------------ out-of-range requests

@pytest.mark.parametrize("ref", [
    dict(index=NUM_BATCHES), dict(index=2**64 - 1), dict(index=2**63),
    dict(epoch=2**62), dict(epoch=2**64 - 1),
])
def test_out_of_range_requests_are_errors_not_hangs(shared_server, ref):
    raw = RawBulk(bulk_port(shared_server.address))
    try:
        assert raw.login().WhichOneof("kind") == "welcome"
        r = pb.BatchRef(seed=0, **{"epoch": 0, "index": 0, **ref})
        raw.fetch([r, pb.BatchRef(seed=0, epoch=0, index=1)])
        got = {f.WhichOneof("kind"): f for f in (raw.read_result(), raw.read_result())}
        assert set(got) == {"error", "batch"}
        assert got["error"].error.kind == pb.OUT_OF_RANGE and got["error"].error.ref == r
    finally:
        raw.close()
    wait_clean(shared_server.address)


def test_a_huge_seed_is_served_deterministically(shared_server):
    from data_service.contract.tensor_layout import batch_digest
    from dnn_worker import LocalDataset
    from data_service.contract.pipeline import PipelineSpec

    seed = 2**63 - 1
    remote = [batch_digest(b) for b in RemoteDataset([shared_server.address], TOKEN, seed=seed)]
    local = [batch_digest(b) for b in LocalDataset(PipelineSpec("examples.synthetic:build_pipeline",
                                                                {"size": 100, "batch_size": 8}), seed=seed)]
    assert remote == local


# ------------------------------------------------------------------ garbage and half-open connections

def _garbage_payloads():
    rnd = __import__("random").Random(0)
    yield b""
    yield b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    yield b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(rnd.randrange(256) for _ in range(200))
    yield struct.pack("<I", 5) + b"\xff" * 5  # a frame that does not parse
    yield struct.pack("<I", 100) + b"\x00" * 10  # a truncated frame, then silence
    for _ in range(5):
        yield bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 3000)))


def test_garbage_and_half_open_connections_on_both_ports(server_factory):
    server = server_factory({"size": 100, "batch_size": 8}, num_workers=1)
    ports = {"grpc": server.port, "data": server.bulk_port}
    hanging = []
    try:
        for name, port in ports.items():
            for payload in _garbage_payloads():
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                if payload:
                    try:
                        s.sendall(payload)
                    except OSError:
                        pass
                hanging.append(s)  # left open: half-open peers that never finish
            for _ in range(10):  # connect and reset at once
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
        serves_normally(server)  # while all of those hang
        wait_until(lambda: server.stats.snapshot().active_streams == 0, 15,
                   "no garbage connection counts as a consumer")
    finally:
        for s in hanging:
            s.close()
    wait_clean(server.address)
    serves_normally(server)


def test_unauthenticated_sessions_time_out(server_factory, monkeypatch):
    from data_service.server import session

    monkeypatch.setattr(session, "HANDSHAKE_TIMEOUT_S", 2.0)  # the deadline is read per connection
    HANDSHAKE_TIMEOUT_S = session.HANDSHAKE_TIMEOUT_S
    server = server_factory({"size": 100, "batch_size": 8}, num_workers=1)
    s = socket.create_connection(("127.0.0.1", server.bulk_port), timeout=5)
    try:
        framing.recv_frame(s)  # the challenge; then silence
        start = time.monotonic()
        s.settimeout(HANDSHAKE_TIMEOUT_S + 20)
        assert s.recv(1) == b""  # the server hangs up
        assert time.monotonic() - start < HANDSHAKE_TIMEOUT_S + 5
    finally:
        s.close()


def test_data_plane_survives_running_out_of_file_descriptors(tmp_path):
    # Many half-open connections exhaust the server's descriptors: accept() fails with EMFILE.
    # Once they are gone the server must accept consumers again; instead its accept loop returned
    # on the first OSError and the data plane stays dead while health says SERVING.
    server = ServerProc({"size": 64, "batch_size": 8}, token=TOKEN).start()
    try:
        proc = psutil.Process(server.pid)
        soft, hard = proc.rlimit(psutil.RLIMIT_NOFILE)
        proc.rlimit(psutil.RLIMIT_NOFILE, (proc.num_fds() + 8, hard))
        socks = [socket.create_connection(("127.0.0.1", server.bulk_port), timeout=5) for _ in range(30)]
        time.sleep(1.0)
        for s in socks:
            s.close()
        proc.rlimit(psutil.RLIMIT_NOFILE, (soft, hard))
        wait_until(lambda: proc.num_fds() < 64, 30, "the half-open sessions are gone")
        assert server.healthy()
        assert len(list(RemoteDataset([server.address], TOKEN, connect_timeout=15))) == 8
    finally:
        server.kill()


# ------------------------------------------------------------------ a hostile server vs. the consumer

def _run_fake(fake: FakeBulkServer, chunks: list[bytes], max_batch_bytes: int = 1 << 20, timeout: float = 10.0):
    """Connect a real BulkConnection to the fake, return its first event (or None on silence)."""
    fake.serve(chunks)
    conn = BulkConnection("fake", "127.0.0.1", fake.port, TOKEN, max_batch_bytes=max_batch_bytes)
    requested: list[int] = []
    real_get = conn._pool.get

    def get(n):
        requested.append(n)
        return real_get(n)

    conn._pool.get = get
    try:
        conn.open(timeout=5)
        try:
            ev = next_event(conn, timeout)
        except TimeoutError:
            ev = None
    finally:
        conn.close()
    return ev, requested


_DTYPES = sorted(tensor_layout.DTYPES)
_u64 = st.integers(0, 2**64 - 1)
_dim = st.integers(0, 2**63 - 1)  # dims >= 2**63: a known hole, tested on its own below
_small = st.integers(0, 64)


@st.composite
def hostile_batch(draw):
    n = draw(st.integers(0, 3))
    structure = draw(st.sampled_from([0, pb.DICT, pb.TUPLE, pb.LIST, pb.TENSOR, 7]))
    metas = []
    for i in range(n):
        metas.append(pb.TensorMeta(
            name=draw(st.sampled_from([str(i), "", "x", "0"])),
            dtype=draw(st.sampled_from(_DTYPES) | st.text(max_size=8)),
            shape=draw(st.lists(_small | _dim, max_size=5)),
            offset=draw(_small | _u64), nbytes=draw(_small | _u64)))
    payload_len = draw(st.integers(0, 512))
    declared = draw(st.sampled_from(["exact", "short", "long", "huge"]))
    payload_bytes = {"exact": payload_len, "short": max(0, payload_len - 7), "long": payload_len + 9,
                     "huge": draw(st.integers(1 << 21, 2**64 - 1))}[declared]
    raw = draw(st.sampled_from([payload_bytes, payload_len]) | _u64)
    header = pb.BatchHeader(ref=pb.BatchRef(seed=0, epoch=0, index=0), structure=structure, tensors=metas,
                            payload_bytes=payload_bytes, raw_bytes=raw)
    return header, bytes(draw(st.binary(min_size=payload_len, max_size=payload_len)))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=hostile_batch())
def test_fuzzed_batch_frames_through_the_real_socket_are_clean_errors(case):
    header, payload = case
    fake = _FAKE[0]
    ev, requested = _run_fake(fake, [frame_bytes(pb.BulkFrame(batch=header)), payload])
    assert ev is not None, "the consumer hung on a hostile frame"
    # Never a huge allocation: at most the limit, and nothing when the header is over it.
    assert all(n <= 1 << 20 for n in requested), requested
    if ev.kind == "batch":  # a well-formed header: the batch decodes within its buffer
        tensors = [ev.batch] if not isinstance(ev.batch, (dict, tuple, list)) else \
            list(ev.batch.values() if isinstance(ev.batch, dict) else ev.batch)
        assert sum(t.numel() * t.element_size() for t in tensors) <= header.payload_bytes
        return
    assert ev.kind == "down"
    assert isinstance(ev.exc, (ProtocolError, ConnectionError)), f"{type(ev.exc).__name__}: {ev.exc}"


_FAKE: list[FakeBulkServer] = []


@pytest.fixture(scope="module", autouse=True)
def _fake_server():
    _FAKE.append(FakeBulkServer())
    yield
    _FAKE.pop().close()


@pytest.mark.parametrize("chunks", [
    [b"\xff\xff\xff\xff"],                                     # a 4 GiB frame header
    [struct.pack("<I", 10) + b"\x08\x96\x01" + b"\x00" * 7],   # unparsable
    [frame_bytes(pb.BulkFrame(welcome=pb.Welcome()))],          # wrong frame kind after the handshake
    [frame_bytes(pb.BulkFrame(fetch=pb.FetchRequest()))],
    [struct.pack("<I", 50)],                                   # truncated, then EOF
])
def test_garbage_frames_from_a_server_are_protocol_errors(chunks):
    ev, requested = _run_fake(_FAKE[0], chunks)
    assert ev is not None and ev.kind == "down"
    assert isinstance(ev.exc, (ProtocolError, ConnectionError)), repr(ev.exc)
    assert all(n <= 1 << 20 for n in requested)


def test_a_zero_size_tensor_with_an_overflowing_dim_is_a_protocol_error():
    header = pb.BatchHeader(ref=pb.BatchRef(), structure=pb.DICT, payload_bytes=0, raw_bytes=0, tensors=[
        pb.TensorMeta(name="x", dtype="float32", shape=[0, 2**63], offset=0, nbytes=0)])
    ev, _ = _run_fake(_FAKE[0], [frame_bytes(pb.BulkFrame(batch=header))])
    assert ev is not None and ev.kind == "down"
    assert isinstance(ev.exc, ProtocolError), repr(ev.exc)


def test_a_server_that_stalls_mid_payload_is_dropped_by_the_batch_timeout():
    # Header says 4096 bytes, 100 arrive, then silence (connection held open).
    from data_service.contract.pipeline import PipelineSpec  # noqa: F401

    header = pb.BatchHeader(ref=pb.BatchRef(), structure=pb.TENSOR, payload_bytes=4096, raw_bytes=4096,
                            tensors=[pb.TensorMeta(name="", dtype="uint8", shape=[4096], nbytes=4096)])
    fake = _FAKE[0]
    fake.serve([frame_bytes(pb.BulkFrame(batch=header)), b"\x00" * 100], linger_s=3)
    conn = BulkConnection("fake", "127.0.0.1", fake.port, TOKEN, max_batch_bytes=1 << 20)
    conn.open(timeout=5)
    try:
        ev = next_event(conn, 15)  # the fake hangs up after 3 s: a clean "down", no partial batch
        assert ev.kind == "down" and isinstance(ev.exc, ConnectionError)
    finally:
        conn.close()


def test_the_consumer_never_allocates_more_than_the_servers_advertised_limit(tmp_path):
    # A (compromised or buggy) server advertises max_batch_bytes=1 MiB in Hello, then announces an
    # 8 GiB batch. RemoteDataset/Fetcher must refuse it before allocating.
    from concurrent import futures

    from data_service.protocol.version import PROTOCOL_VERSION
    from dnn_worker.transport import buffers

    fake = _FAKE[0]

    class Servicer(pb_grpc.DataServiceServicer):
        def Hello(self, request, context):
            return pb.HelloResponse(server_version=PROTOCOL_VERSION, bulk_port=fake.port, workers=1,
                                    dataset=pb.DatasetInfo(num_samples=8, batch_size=8, pipeline="fake",
                                                           fingerprint="f", max_batch_bytes=1 << 20))

    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_DataServiceServicer_to_server(Servicer(), grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    huge = 8 << 30
    header = pb.BatchHeader(ref=pb.BatchRef(seed=0, epoch=0, index=0), structure=pb.TENSOR, payload_bytes=huge,
                            raw_bytes=huge, tensors=[pb.TensorMeta(name="", dtype="uint8", shape=[huge], nbytes=huge)])
    fake.serve([frame_bytes(pb.BulkFrame(batch=header)), b"\x00" * 1000])
    requested: list[int] = []
    real_get = buffers.BufferPool.get

    def get(self, n):
        requested.append(n)
        return real_get(self, n)

    buffers.BufferPool.get = get
    try:
        ds = RemoteDataset([f"127.0.0.1:{port}"], TOKEN, connect_timeout=1, batch_timeout=1)
        with pytest.raises(Exception):
            list(ds)
    finally:
        buffers.BufferPool.get = real_get
        grpc_server.stop(0)
    assert not requested or max(requested) <= 1 << 20, f"allocated {max(requested)} bytes for a hostile header"
