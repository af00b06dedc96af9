"""index.bin: round trip, index.json still read, mapped columns (open cost independent of samples), corrupt files."""
from __future__ import annotations

import gc
import os
import tracemalloc

import numpy as np
import pytest

from data_service.errors import ConfigError
from data_service.shards.format import INDEX_NAME, JSON_INDEX_NAME, ShardIndex, ShardInfo
from data_service.shards.indexfile import IndexWriter, open_index_file, read_index, verify, write_index
from data_service.storage import LocalStore


def _index(per_shard=(3, 0, 2), names=None) -> ShardIndex:
    rng = np.random.default_rng(0)
    shards, first = [], 0
    offsets, lengths, labels = [], [], []
    for k, count in enumerate(per_shard):
        pos = 512
        for _ in range(count):
            n = int(rng.integers(1, 5000))
            offsets.append(pos)
            lengths.append(n)
            labels.append(int(rng.integers(0, 7)))
            pos += -(-n // 512) * 512 + 1024
        name = names[k] if names else f"shard-{k:06d}.tar"
        shards.append(ShardInfo(name, pos + 1024, first, count))
        first += count
    return ShardIndex([f"c{i}" for i in range(7)], shards, np.array(offsets), np.array(lengths), np.array(labels))


def _same(a: ShardIndex, b: ShardIndex) -> None:
    assert a.classes == b.classes and list(a.shards) == list(b.shards) and len(a) == len(b)
    for col in ("offsets", "lengths", "labels"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert a.data_bytes == b.data_bytes
    assert [a.parts(i, len(a)) for i in range(len(a))] == [b.parts(i, len(b)) for i in range(len(b))]


def test_index_bin_round_trips_with_subfolder_names_and_compact_dtypes(tmp_path):
    index = _index((3, 0, 2, 4), names=["a/x.tar", "a/b/y.tar", "z.tar", "c-1.tar"])
    digest = write_index(str(tmp_path), index)
    back = read_index(str(tmp_path))
    _same(index, back)
    assert back.id == digest and back.max_stride > 0
    assert (back.offsets.dtype, back.lengths.dtype, back.labels.dtype) == (np.dtype("<i8"), np.dtype("<u4"),
                                                                             np.dtype("<i4"))
    assert [back.shard_at(i) for i in range(len(back))] == [0, 0, 0, 2, 2, 3, 3, 3, 3]
    assert back.sample(3) == (2, int(index.offsets[3]), int(index.lengths[3]), int(index.labels[3]))
    verify(str(tmp_path / INDEX_NAME))


def test_index_json_is_still_read_and_converts_to_the_same_index(tmp_path):
    index = _index()
    (tmp_path / JSON_INDEX_NAME).write_bytes(index.to_json())
    old = read_index(str(tmp_path))
    _same(index, old)
    write_index(LocalStore(str(tmp_path)), old)
    _same(index, read_index(str(tmp_path)))  # index.bin is read first


@pytest.mark.parametrize("name", ["../x.tar", "/abs.tar", "a//b.tar", "a/./b.tar", "", "a\\b.tar"])
def test_shard_names_stay_below_the_prefix(tmp_path, name):
    with IndexWriter(str(tmp_path)) as w, pytest.raises(ConfigError, match="not a relative path"):
        w.add_shard(name, 2048, [512], [10], [0])


def test_a_sample_outside_its_shard_is_refused_when_written(tmp_path):
    with IndexWriter(str(tmp_path)) as w, pytest.raises(ConfigError, match="outside its 1000 bytes"):
        w.add_shard("s.tar", 1000, [512, 900], [10, 200], [0, 0])


def test_samples_out_of_byte_order_are_refused_when_written(tmp_path):
    # a shuffle block is cached as one byte range per shard: a sample before its predecessor
    # would fall outside that range and read other bytes
    with IndexWriter(str(tmp_path)) as w, pytest.raises(ConfigError, match="in the order of their bytes"):
        w.add_shard("s.tar", 4096, [1536, 512], [100, 100], [0, 1])


def _write_big(path, n: int, shards: int = 4) -> None:
    per = n // shards
    with IndexWriter(os.path.dirname(path)) as w:
        for k in range(shards):
            offsets = np.arange(per, dtype=np.int64) * 2048 + 512
            w.add_shard(f"shard-{k:06d}.tar", per * 2048 + 1024, offsets, np.full(per, 1000), np.arange(per) % 1000)
        w.write_file(str(path), [str(c) for c in range(1000)])


def _open_cost(path) -> tuple[int, int]:
    """(bytes Python allocated while opening, objects left alive by the open), the least of three
    opens: both figures are taken process-wide, so a thread another test left running (a server's
    reader winding down) can add to one open but not to all three."""
    costs = [_one_open_cost(path) for _ in range(3)]
    return min(c[0] for c in costs), min(c[1] for c in costs)


def _one_open_cost(path) -> tuple[int, int]:
    gc.collect()
    before = len(gc.get_objects())
    tracemalloc.start()
    index = open_index_file(str(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    objects = len(gc.get_objects()) - before
    assert len(index) > 0
    return peak, objects


@pytest.mark.slow
def test_opening_costs_the_same_at_4_thousand_and_4_million_samples(tmp_path):
    _write_big(tmp_path / "small.bin", 4_000)
    _write_big(tmp_path / "big.bin", 4_000_000)
    assert os.path.getsize(tmp_path / "big.bin") > 60_000_000  # 16 bytes a sample, in the file
    small, big = _open_cost(tmp_path / "small.bin"), _open_cost(tmp_path / "big.bin")
    # the columns of 4 million samples are 64 MB and 4 million objects: any per-sample cost is
    # thousands of times these margins
    assert big[0] < small[0] + 65_536, (small, big)  # bytes allocated: the header, not the columns
    assert big[1] <= small[1] + 100, (small, big)  # no per-sample objects
    index = open_index_file(str(tmp_path / "big.bin"))
    assert not index.offsets.flags.owndata and not index.offsets.flags.writeable  # a view of the mapped file
    assert index.parts(3_999_000, 4_000_000) == [(3, 999_000 * 2048 + 512, 999_999 * 2048 + 1512)]


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[:-1], "truncated"),
    (lambda raw: raw[:len(raw) // 2], "truncated"),
    (lambda raw: raw[:10], "not a hetero-shards index|truncated"),
    (lambda raw: b"", r"is empty \(0 bytes\)"),
    (lambda raw: b'{"format": "hetero-shards"}', "not a hetero-shards index"),
    (lambda raw: raw[:30] + bytes([raw[30] ^ 1]) + raw[31:], "header is truncated or corrupt"),
    (lambda raw: raw[:8] + b"\x09" + raw[9:], "version 9"),
    (lambda raw: raw.replace(b"shard-000002", b"shard-000009"), "shard table .* corrupt"),
])
def test_a_corrupt_or_truncated_index_is_a_config_error_naming_it(tmp_path, damage, message):
    write_index(str(tmp_path), _index())
    path = tmp_path / INDEX_NAME
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ConfigError, match=message) as e:
        read_index(str(tmp_path))
    assert str(path) in str(e.value) and "hetero prepare" in str(e.value)


def test_a_corrupt_sample_column_is_caught_by_verify_and_by_reading_that_sample(tmp_path):
    write_index(str(tmp_path), _index())
    path = tmp_path / INDEX_NAME
    index = open_index_file(str(path))
    raw = bytearray(path.read_bytes())
    pos = raw.find(np.array(index.offsets[1:3], dtype="<i8").tobytes())
    assert pos > 0
    raw[pos:pos + 8] = np.array([1 << 40], dtype="<i8").tobytes()  # sample 1 lies far past its shard
    path.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match="column offsets is corrupt"):
        verify(str(path))
    damaged = read_index(str(tmp_path))  # opening reads no per-sample column
    assert damaged.sample(3)  # another shard reads as ever
    with pytest.raises(ConfigError, match="sample 1 .*past the end of shard shard-000000.tar.*corrupt"):
        damaged.sample(1)
    shard, start, length, _ = damaged.sample(0)  # its shard's sound entry still reads
    assert damaged.parts(0, 2) == [(shard, start, start + length)]  # the bad entry's bytes are never fetched


def _mapped_kb(path) -> int:
    """Resident KB of this process's mappings of ``path`` (Linux smaps)."""
    total, current = 0, ""
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                current = head[-1] if len(head) >= 6 else ""
            elif line.startswith("Rss:") and current == str(path):
                total += int(head[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux smaps")
def test_reading_samples_maps_no_column_pages_into_the_process(tmp_path):
    path = tmp_path / "big.bin"
    _write_big(path, 1_000_000)
    index = open_index_file(str(path))
    before = _mapped_kb(path)
    rng = np.random.default_rng(1)
    for i in rng.integers(0, len(index), 2000):
        index.sample(int(i))
        index.parts(int(i), min(len(index), int(i) + 64))
    assert _mapped_kb(path) == before  # entries come by pread: the columns stay in the page cache only


def test_a_header_length_past_the_file_is_refused_before_it_is_read(tmp_path):
    write_index(str(tmp_path), _index())
    path = tmp_path / INDEX_NAME
    raw = path.read_bytes()
    path.write_bytes(raw[:12] + (0xFFFF_FFF0).to_bytes(4, "little") + raw[16:])
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="truncated or corrupt"):
            read_index(str(tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # not the 4 GiB the damaged length announces
