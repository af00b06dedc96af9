"""A byte flipped between a data worker and the consumer is named and the batch asked for again:
never trained on (the batch's CRC32C covers its identity, layout and payload)."""
from __future__ import annotations

import logging
import zlib

import google_crc32c
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.common.corrupt import FlipProxy
from data_service.contract import tensor_layout
from data_service.contract.tensor_layout import batch_digest
from data_service.protocol.generated import pb
from data_service.protocol import integrity
from data_service.protocol.integrity import Mismatch, batch_crc
from dnn_worker import RemoteDataset
from hetero.testing import Reference, ServerProc, free_port
from hetero.testing.processes import PIPELINE

OPTS = {"size": 96, "batch_size": 8, "shape": [3, 32, 32]}  # 12 batches of 24 KiB


def test_the_crc_covers_identity_layout_and_payload():
    payload = bytearray(range(256)) * 4
    header = pb.BatchHeader(ref=pb.BatchRef(seed=1, epoch=2, index=3), payload_bytes=1000, raw_bytes=1000)
    header.tensors.add(dtype="uint8", shape=[1000])
    crc = batch_crc(header, payload)
    assert batch_crc(header, payload + b"tail past the payload") == crc
    other = pb.BatchHeader()
    other.CopyFrom(header)
    other.ref.index = 7  # a flip that would pass one batch off as another
    assert batch_crc(other, payload) != crc
    other.CopyFrom(header)
    other.tensors[0].shape[0] = 999
    assert batch_crc(other, payload) != crc
    payload[500] ^= 0x10
    assert batch_crc(header, payload) != crc


def mismatch(header: pb.BatchHeader, payload) -> Mismatch | None:
    """How ``payload`` fails its header's checksum, summed piece by piece as a consumer does; None: it
    passes, or the header carries none."""
    if not integrity.sealed(header):
        return None
    running = integrity.Running(header)
    running.update(memoryview(payload)[:header.payload_bytes])
    return running.mismatch()


def _header() -> pb.BatchHeader:
    header = pb.BatchHeader(ref=pb.BatchRef(seed=1, epoch=2, index=3), payload_bytes=1000, raw_bytes=1000)
    header.tensors.add(dtype="uint8", shape=[1000])
    return header


def test_the_checksum_is_the_crc32c_of_identity_then_payload():
    """What both sides compute: a fixed definition, not whatever the installed code happens to do."""
    header, payload = _header(), bytes(range(256)) * 4
    identity = pb.BatchHeader(ref=header.ref, tensors=header.tensors, payload_bytes=1000, raw_bytes=1000)
    want = google_crc32c.extend(google_crc32c.value(identity.SerializeToString(deterministic=True)), payload[:1000])
    assert batch_crc(header, payload) == want
    header.payload_crc32c = batch_crc(header, bytearray(payload))
    assert header.payload_crc32c == want and not header.HasField("payload_crc32") and integrity.sealed(header)


def test_a_sealed_batch_passes_in_place_and_a_flip_is_named():
    header, payload = _header(), bytearray(range(256)) * 4
    assert not integrity.sealed(header) and mismatch(header, payload) is None  # nothing to check
    header.payload_crc32c = batch_crc(header, memoryview(payload))
    assert mismatch(header, payload) is None
    payload[999] ^= 1
    bad = mismatch(header, payload)
    assert bad == Mismatch("CRC32C", batch_crc(header, payload), header.payload_crc32c) and bad.got != bad.want
    payload[999] ^= 1
    payload[1000] ^= 1  # past the payload: not the batch's
    assert mismatch(header, payload) is None


def test_a_protocol_1_0_servers_crc32_is_still_checked():
    """A 1.0 data server wrote zlib's CRC-32 into payload_crc32: a newer consumer checks that one."""
    header, payload = _header(), bytearray(range(256)) * 4
    identity = pb.BatchHeader(ref=header.ref, tensors=header.tensors, payload_bytes=1000, raw_bytes=1000)
    header.payload_crc32 = zlib.crc32(payload[:1000], zlib.crc32(identity.SerializeToString(deterministic=True)))
    assert integrity.sealed(header) and mismatch(header, payload) is None
    payload[0] ^= 0x80
    bad = mismatch(header, payload)
    assert bad is not None and bad.checksum == "CRC-32" and bad.want == header.payload_crc32


@pytest.fixture
def flipped_server():
    """One data server whose data plane is reached through a proxy that flips a byte once armed."""
    bulk = free_port()
    proxy = FlipProxy(("127.0.0.1", bulk))
    server = ServerProc(OPTS, pipeline=PIPELINE, bulk_port=bulk, advertise_bulk_port=proxy.port).start()
    yield server, proxy
    proxy.close()
    server.stop()


def test_a_flipped_payload_byte_is_named_and_the_batch_fetched_again(flipped_server, caplog):
    server, proxy = flipped_server
    # inside a payload (the stream is 99 % payload bytes) of the first connection; the consumer
    # then connects again, to the same server, and gets the batch whole
    proxy.arm(offset=60_000, mask=0x04)
    ref = Reference(PIPELINE, OPTS, seed=3).digests(0)
    ds = RemoteDataset([server.address], server.token, seed=3, shared_memory=False, connect_timeout=30,
                       batch_timeout=20)
    with caplog.at_level(logging.WARNING, logger="dnn_worker"):
        got = [batch_digest(b) for b in ds]
    assert proxy.flipped == 1
    assert got == ref  # every batch as built in-process: the damaged copy was not trained on
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "fail their CRC32C" in said and "the batch is asked for again" in said, said


_DTYPES = [torch.uint8, torch.bool, torch.float32, torch.bfloat16, torch.int64, torch.complex64]


@settings(max_examples=40, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 70), max_size=3)), min_size=1, max_size=4),
       seed=st.integers(0, 2**32 - 1))
def test_a_worker_sums_the_payload_as_it_writes_it(shapes, seed):
    """write_summed_payload lays out the same bytes as write_payload, and its CRC32C covers the whole
    payload, the alignment gaps between tensors included (whatever an earlier batch left there)."""
    gen = torch.Generator().manual_seed(seed)
    batch = {f"t{i}": torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8).to(_DTYPES[d])
             for i, (d, shape) in enumerate(shapes)}
    structure, metas, tensors, size = tensor_layout.plan_layout(batch)
    stale = np.random.default_rng(seed).integers(0, 256, size + 4096, dtype=np.uint8).tobytes()
    want, got = bytearray(stale), bytearray(stale)  # a slot that held an earlier batch
    tensor_layout.write_payload(metas, tensors, want)
    header = pb.BatchHeader(ref=pb.BatchRef(seed=1, epoch=0, index=seed % 100), structure=structure, tensors=metas,
                            payload_bytes=size, raw_bytes=size)
    crc = tensor_layout.write_summed_payload(metas, tensors, got, integrity.header_crc(header))
    assert got == want
    assert crc == batch_crc(header, want)
