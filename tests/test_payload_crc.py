"""A byte flipped between a data worker and the consumer is named and the batch asked for again:
never trained on (the batch's CRC-32 covers its identity, layout and payload)."""
from __future__ import annotations

import logging

import pytest

from benchmarks.common.corrupt import FlipProxy
from data_service.contract.tensor_layout import batch_digest
from data_service.protocol.generated import pb
from data_service.protocol.integrity import batch_crc
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
    assert "fail their CRC-32" in said and "the batch is asked for again" in said, said
