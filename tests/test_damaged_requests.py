"""A consumer's request damaged on the way is answered at once, never misread as another request:
the server replies with the reason and closes, and the consumer asks again within a second or
two instead of waiting out ``batch_timeout`` (data_service/server/request_reader.py)."""
from __future__ import annotations

import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _fault_helpers import stats, wait_clean
from benchmarks.common.corrupt import FlipProxy
from conftest import TOKEN
from data_service.contract.batch_id import BatchId
from data_service.contract.tensor_layout import batch_digest
from data_service.protocol import framing
from data_service.protocol.generated import pb
from data_service.protocol.version import PROTOCOL_VERSION
from data_service.server.request_reader import REQUEST_WHOLE_S
from dnn_worker import ControlClient, RemoteDataset
from dnn_worker.fetch.scheduler import Scheduler
from hetero.testing import Reference, free_port
from hetero.testing.processes import PIPELINE

OPTS = {"size": 96, "batch_size": 8, "shape": [3, 32, 32]}  # 12 batches of 24 KiB

pytestmark = pytest.mark.timeout(120)


@settings(max_examples=300, deadline=None)
@given(indices=st.lists(st.integers(0, 1 << 40), min_size=1, max_size=40), hint=st.booleans(),
       where=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255), cut=st.integers(1, 64))
def test_a_sealed_frame_with_any_byte_flipped_or_cut_short_fails_its_seal(indices, hint, where, mask, cut):
    refs = [pb.BatchRef(seed=7, epoch=1, index=i) for i in indices]
    frame = pb.BulkFrame(fetch=pb.FetchRequest(prefetch=refs) if hint else pb.FetchRequest(batches=refs))
    raw = framing.seal(frame)
    body = bytearray(raw[framing._LEN.size:])
    assert framing.unseal(body) == frame.SerializeToString()
    damaged = bytearray(body)
    damaged[int(where * len(body))] ^= mask  # CRC-32 catches every error burst up to 32 bits
    assert framing.unseal(damaged) is None
    assert framing.unseal(body[:max(0, len(body) - cut)]) is None  # a length damaged shorter


class Client:
    """A hand-driven consumer of the data plane: frames sealed or not, damaged as the test says."""

    def __init__(self, server) -> None:
        with ControlClient(server.address, TOKEN) as ctl:
            port = ctl.hello().bulk_port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.nonce = framing.recv_frame(self.sock).challenge.nonce

    def hello(self, sealed: bool = True, damage=lambda raw: raw) -> pb.BulkFrame:
        hello = pb.BulkHello(client_version=PROTOCOL_VERSION, proof=framing.token_proof(TOKEN, self.nonce),
                             client_id="hand", sealed=sealed)
        frame = pb.BulkFrame(hello=hello)
        self.sock.sendall(damage(framing.seal(frame) if sealed else framing.frame_bytes(frame)))
        return framing.recv_frame(self.sock)

    def fetch(self, index: int, sealed: bool = True, damage=lambda raw: raw) -> None:
        frame = pb.BulkFrame(fetch=pb.FetchRequest(batches=[pb.BatchRef(seed=1, epoch=0, index=index)]))
        self.sock.sendall(damage(framing.seal(frame) if sealed else framing.frame_bytes(frame)))

    def reply(self) -> pb.BulkFrame:
        frame = framing.recv_frame(self.sock)
        if frame.WhichOneof("kind") == "batch" and frame.batch.payload_bytes:
            framing.recv_into(self.sock, memoryview(bytearray(frame.batch.payload_bytes)))
        return frame

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def index_to_7(raw: bytes) -> bytes:
    """The request for batch 5 made one for batch 7 (the varint 5, XOR 0x02)."""
    out = bytearray(raw)
    at = out.rindex(bytes([(3 << 3) | 0, 5]))  # BatchRef.index = 5
    out[at + 1] ^= 0x02
    return bytes(out)


@pytest.fixture
def server(server_factory):
    return server_factory(OPTS, num_workers=1)


def test_a_request_for_batch_5_damaged_into_batch_7_is_refused_at_once_and_nothing_is_built(server):
    c = Client(server)
    assert c.hello().WhichOneof("kind") == "welcome"
    c.fetch(4)
    assert c.reply().batch.ref.index == 4  # sealed requests are served
    start = time.monotonic()
    c.fetch(5, damage=index_to_7)
    reply = c.reply()
    took = time.monotonic() - start
    assert reply.WhichOneof("kind") == "error" and not reply.error.HasField("ref"), reply
    assert reply.error.kind == pb.BAD_REQUEST and "fails its CRC-32: damaged on the way" in reply.error.message
    assert c.closed()
    print(f"\nrefused in {took * 1000:.1f} ms: {reply.error.message}")
    wait_clean(server.address)


def test_an_unsealed_request_damaged_into_another_batch_cannot_pass_for_the_one_asked(server):
    # A consumer from before sealing: the server reads the damaged request as one for batch 7 and
    # builds it; the batch's header says 7 (its CRC-32 covers its identity: test_payload_crc.py),
    # and the consumer, owing 5, does not take it.
    c = Client(server)
    assert c.hello(sealed=False).WhichOneof("kind") == "welcome"
    c.fetch(5, sealed=False, damage=index_to_7)
    header = c.reply().batch
    assert header.ref.index == 7
    sched = Scheduler([BatchId(1, 0, i) for i in (5, 6)])
    sched.lanes.lane("s:1", window=1)
    sched.plan(0, ["s:1"], (), now=0.0)
    assert [r.index for r in sched.lanes["s:1"].outstanding] == [5]
    assert not sched.arrived("s:1", BatchId.of(header.ref), header.payload_bytes, now=1.0)


def test_a_damaged_length_is_answered_once_the_frame_stays_incomplete(server):
    c = Client(server)
    c.hello()

    def longer(raw: bytes) -> bytes:  # announces 16 bytes that never come
        return framing._LEN.pack(framing._LEN.unpack_from(raw)[0] + 16) + raw[framing._LEN.size:]

    start = time.monotonic()
    c.fetch(3, damage=longer)
    reply = c.reply()
    took = time.monotonic() - start
    assert reply.WhichOneof("kind") == "error" and "stayed incomplete" in reply.error.message, reply
    assert took >= REQUEST_WHOLE_S
    print(f"\nanswered after {took:.2f} s: {reply.error.message}")
    assert c.closed()


def test_a_damaged_hello_is_refused_as_damaged_not_as_a_wrong_token(server):
    def proof_flipped(raw: bytes) -> bytes:
        out = bytearray(raw)
        out[20] ^= 0x01  # inside the 32-byte proof
        return bytes(out)

    before = stats(server.address).auth_failures
    reply = Client(server).hello(damage=proof_flipped)
    assert reply.WhichOneof("kind") == "error" and reply.error.kind == pb.BAD_REQUEST, reply
    assert "hello from hand fails its CRC-32" in reply.error.message
    assert stats(server.address).auth_failures == before
    # an unsealed hello with a wrong proof is still a wrong token
    reply = Client(server).hello(sealed=False, damage=proof_flipped)
    assert reply.error.kind == pb.PERMISSION_DENIED


def frames(head: bytes) -> list[tuple[int, int]]:
    """(start, end) of each whole frame in a consumer's stream."""
    out, at = [], 0
    while at + 4 <= len(head):
        end = at + 4 + framing._LEN.unpack_from(head, at)[0]
        if end > len(head):
            break
        out.append((at, end))
        at = end
    return out


@pytest.mark.serial  # it times the consumer's wait
def test_a_damaged_request_is_asked_again_within_a_second_or_two_not_after_batch_timeout(server_factory):
    bulk = free_port()
    proxy = FlipProxy(("127.0.0.1", bulk))
    server = server_factory(OPTS, num_workers=1, bulk_port=bulk, advertise_bulk_port=proxy.port)
    ref = Reference(PIPELINE, OPTS, seed=3).digests(0)

    def epoch():
        ds = RemoteDataset([server.address], TOKEN, seed=3, shared_memory=False, batch_timeout=20, connect_timeout=30)
        got, at = [], []
        for batch in ds:
            got.append(batch_digest(batch))
            at.append(time.monotonic())
        return got, at

    try:
        assert epoch()[0] == ref
        head = bytes(proxy.head)
        hello, fetch = frames(head)[:2]  # the clean stream: the hello, the first request
        grow = next(1 << b for b in range(3, 8) if not head[fetch[0]] & 1 << b)  # a bit the length lacks
        places = {"hello": (hello[0] + 20, 0x10), "request length, longer": (fetch[0], grow),
                  "request length, shorter": (fetch[0], 1 << 2 if head[fetch[0]] & 4 else 1),
                  "request body": (fetch[0] + 8, 0x10), "request seal": (fetch[1] - 1, 0x10)}
        waits = {}
        for place, (offset, mask) in places.items():
            proxy.flipped_at.clear()
            proxy.arm(offset, mask, requests=True)
            got, at = epoch()
            assert got == ref, place  # every batch, the right bytes
            assert len(proxy.flipped_at) == 1, place
            waits[place] = min(t for t in at if t > proxy.flipped_at[0]) - proxy.flipped_at[0]
        print("\nfrom the flip to the next batch: " + ", ".join(f"{p} {w:.2f} s" for p, w in waits.items()))
        assert all(w < 20 / 4 for w in waits.values()), waits  # asked again, not after batch_timeout (20 s)
    finally:
        proxy.close()
