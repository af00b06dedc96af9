"""Which protocol versions talk: one major version, except a consumer that would not check the
batches' CRC32C; a refusal says why and what to install."""
from __future__ import annotations

import pytest

from data_service.protocol.version import PROTOCOL_VERSION, compatible, mismatch_message


@pytest.mark.parametrize("client,server,ok", [
    ("1.1", "1.1", True),
    ("1.2", "1.1", True),   # a later minor adds fields only
    ("1.1", "1.0", True),   # a newer consumer checks a 1.0 server's CRC-32
    ("1.0", "1.0", True),
    ("1.0", "1.1", False),  # it would not check the CRC32C: its batches would arrive unchecked
    ("1", "1.1", False),    # "1" is 1.0
    ("2.0", "1.1", False),
    ("1.1", "2.0", False),
    ("1.x", "1.1", False),
    ("1.1.1", "1.1", False),
    ("", "1.1", False),
    ("garbage", "1.1", False),
])
def test_who_talks(client, server, ok):
    assert compatible(client, server) is ok


def test_this_release_speaks_1_1():
    assert PROTOCOL_VERSION == "1.1" and compatible(PROTOCOL_VERSION, PROTOCOL_VERSION)


def test_a_1_0_consumer_is_told_why_it_is_refused():
    said = mismatch_message("1.0", "1.1")
    assert "'1.0'" in said and "'1.1'" in said
    assert "CRC32C" in said and "does not check" in said and "unchecked" in said
    assert "install the same hetero-data-service release on data and GPU nodes" in said


def test_another_major_version_is_refused_without_the_checksum_story():
    said = mismatch_message("2.0", "1.1")
    assert "'2.0'" in said and "'1.1'" in said and "CRC32C" not in said and "install the same" in said
    assert "another major version" in mismatch_message("1.1", "another major version")
