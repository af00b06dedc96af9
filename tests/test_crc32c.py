"""data_service.crc32c: the CRC32C of any buffer, in place, equal to google-crc32c's on every input."""
from __future__ import annotations

import mmap
import platform
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import data_service.crc32c as crc_module
from data_service.crc32c.inplace import _portable, _portable_copy, copy_crc32c, crc32c

IMPLEMENTATIONS = [pytest.param(crc32c, id=crc_module.IMPLEMENTATION), pytest.param(_portable, id="portable")]
COPIES = [pytest.param(copy_crc32c, id=crc_module.IMPLEMENTATION), pytest.param(_portable_copy, id="portable")]

# RFC 3720 (iSCSI), B.4, and the usual check value
VECTORS = [(b"123456789", 0xE3069283), (bytes(32), 0x8A9136AA), (b"\xff" * 32, 0x62A8AB43),
           (bytes(range(32)), 0x46DD794E), (bytes(range(31, -1, -1)), 0x113FDB5C), (b"", 0)]


def test_the_cpu_instruction_is_used_where_the_cpu_has_it():
    """A build that silently lost the extension would pass every other test, slowly."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if platform.machine() != "x86_64" or " sse4_2" not in flags:
        pytest.skip("no SSE4.2 here: google-crc32c serves")
    assert crc_module.IMPLEMENTATION == "sse4.2", "data_service/crc32c/_hw.c is not built: pip install -e ."


@pytest.mark.parametrize("fn", IMPLEMENTATIONS)
@pytest.mark.parametrize("data,want", VECTORS, ids=[f"{want:#010x}" for _, want in VECTORS])
def test_known_vectors(fn, data, want):
    assert fn(data) == want


@pytest.mark.parametrize("fn", IMPLEMENTATIONS)
@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 70_000), seed=st.integers(0, 2**32 - 1), skip=st.integers(0, 15),
       cut=st.integers(0, 70_000))
def test_equal_to_google_crc32c_at_any_alignment_and_split(fn, size, seed, skip, cut):
    # past 3 x 8 KiB the three-stream loop runs, past 3 x 256 bytes the short one; skip moves the
    # start off 8-byte alignment
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    view = memoryview(bytearray(data))[min(skip, size):]
    want = google_crc32c.value(bytes(view))
    assert fn(view) == want
    cut = min(cut, len(view))
    assert fn(view[cut:], fn(view[:cut])) == want


def test_long_buffers_cross_every_loop():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, (3 << 20) + 12_345, dtype=np.uint8)
    assert crc32c(data) == google_crc32c.value(data.tobytes()) == _portable(data)


def _inputs():
    payload = bytes(range(256)) * 40 + b"tail"
    mm = mmap.mmap(-1, len(payload))
    mm[:] = payload
    readonly = np.frombuffer(payload, dtype=np.uint8)
    floats = np.frombuffer(payload[:10_240], dtype=np.float32).reshape(40, 64)
    tensor = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return [("bytes", payload, payload), ("bytearray", bytearray(payload), payload),
            ("memoryview", memoryview(bytearray(payload)), payload), ("readonly memoryview", memoryview(payload), payload),
            ("mmap", mm, payload), ("readonly numpy", readonly, payload),
            ("writable numpy", readonly.copy(), payload), ("2-D float32 numpy", floats, payload[:10_240]),
            ("torch tensor's numpy", tensor.numpy(), payload)]


@pytest.mark.parametrize("fn", IMPLEMENTATIONS)
@pytest.mark.parametrize("name,data,same_as", _inputs(), ids=[i[0] for i in _inputs()])
def test_any_buffer_in_place(fn, name, data, same_as):
    assert fn(data) == google_crc32c.value(same_as), name


@pytest.mark.parametrize("fn", IMPLEMENTATIONS)
def test_a_buffer_is_read_where_it_lies(fn):
    """Not a copy taken before: a change to the buffer changes the next value."""
    buf = bytearray(100_000)
    view = memoryview(buf)
    before = fn(view)
    buf[99_999] = 1
    assert fn(view) != before == google_crc32c.value(bytes(100_000))


@pytest.mark.parametrize("fn", IMPLEMENTATIONS)
def test_bad_input_is_named(fn):
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        fn(np.zeros((8, 8), dtype=np.uint8)[:, ::2])
    for bad in (-1, 1 << 32):
        with pytest.raises(ValueError, match=rf"crc={bad}.*32-bit CRC"):
            fn(b"x", bad)


@pytest.mark.parametrize("copy", COPIES)
@settings(max_examples=40, deadline=None)
@given(size=st.integers(0, 200_000), seed=st.integers(0, 2**32 - 1), skip=st.integers(0, 15),
       start=st.integers(0, 2**32 - 1))
def test_copy_then_sum_equals_the_sum_of_the_source(copy, size, seed, skip, start):
    # past 64 KiB the copy runs in pieces, each summed after it is copied
    src = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    slot = bytearray(size + 16)
    dst = memoryview(slot)[skip:skip + size]
    assert copy(dst, src, start) == google_crc32c.extend(start, src.tobytes())
    assert bytes(dst) == src.tobytes()
    assert slot[:skip] == bytes(skip) and slot[skip + size:] == bytes(16 - skip)  # nothing written outside dst


@pytest.mark.parametrize("copy", COPIES)
def test_copy_refuses_a_destination_of_another_size_or_a_read_only_one(copy):
    with pytest.raises(ValueError, match="dst holds 9 bytes, src 10"):
        copy(bytearray(9), b"0123456789")
    with pytest.raises(TypeError):
        copy(b"0123456789", b"0123456789")
    with pytest.raises(ValueError, match="crc=-1"):
        copy(bytearray(1), b"x", -1)


def test_the_speed_benchmark_runs_and_names_every_contender(capsys):
    from benchmarks import crc_speed

    assert crc_speed.main(["--sizes", "0.0625", "--seconds", "0.01", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("zlib.crc32", "google_crc32c + copy", "copy_crc32c", "| 0.0625 |")), out


def test_the_transport_benchmark_refuses_a_baseline_that_is_no_checkout(tmp_path, capsys):
    from benchmarks import transport

    with pytest.raises(SystemExit) as info:
        transport.main(["--baseline-root", str(tmp_path)])
    assert info.value.code == 2 and "is not a checkout of this repository" in capsys.readouterr().err
