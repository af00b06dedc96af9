"""index.bin's per-sample entries checked when read: a corrupt entry is a ConfigError naming the index,
the shard, the sample, the value and the fix, never bytes or a label handed to training; a sample
number outside the index is an IndexError, never another entry or the header's padding."""
from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

from data_service.errors import ConfigError
from data_service.shards import format as shard_format
from data_service.shards.dataset import ShardDataset
from data_service.shards.entries import CorruptEntryError
from data_service.shards.format import INDEX_NAME, JSON_INDEX_NAME, ShardIndex, ShardInfo
from data_service.shards.indexfile import PREFIX, IndexWriter, _aligned, open_index_file, read_index, verify

CLASSES = ["cat", "dog", "eel"]
COUNTS = (3, 0, 4)  # an empty shard between two: its neighbours' entries must not be compared across it


def _payload(i: int) -> bytes:
    return bytes([i % 251]) * (100 + 37 * i)


def _prefix(folder) -> list[tuple[bytes, int]]:
    """Tar shards and their index.bin in ``folder``; every sample's ``(bytes, label)`` in order."""
    samples, i = [], 0
    with IndexWriter(str(folder)) as w:
        for k, count in enumerate(COUNTS):
            name = f"shard-{k:06d}.tar"
            offsets, lengths, labels = [], [], []
            with tarfile.open(folder / name, "w", format=tarfile.USTAR_FORMAT) as tar:
                for _ in range(count):
                    data, label = _payload(i), i % len(CLASSES)
                    info = tarfile.TarInfo(f"{i:09d}.jpg")
                    info.size = len(data)
                    offsets.append(tar.offset + tarfile.BLOCKSIZE)  # past the member's one ustar header block
                    tar.addfile(info, io.BytesIO(data))
                    lengths.append(len(data))
                    labels.append(label)
                    samples.append((data, label))
                    i += 1
            w.add_shard(name, (folder / name).stat().st_size, offsets, lengths, labels)
        w.write_file(str(folder / INDEX_NAME), CLASSES)
    return samples


def _poke(path, column: str, i: int, value: int, byte: int | None = None) -> None:
    """Overwrite entry ``i`` of ``column`` in the index.bin at ``path`` (or only its byte ``byte``)."""
    raw = path.read_bytes()
    length = PREFIX.unpack(raw[:PREFIX.size])[2]
    col = json.loads(raw[PREFIX.size:PREFIX.size + length])["columns"][column]
    dtype = np.dtype(col["dtype"])
    at = _aligned(PREFIX.size + length) + int(col["at"]) + i * dtype.itemsize
    new = np.array([value], dtype=dtype).tobytes() if byte is None else bytes([value])
    at += byte or 0
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)


@pytest.fixture
def prefix(tmp_path):
    return tmp_path, _prefix(tmp_path)


def _refused(folder, bad, message: str) -> str:
    """Opening succeeds (no per-sample read); sample ``bad`` (or each of the samples ``bad``) is refused,
    the first with ``message``; every other sample of the index reads (a bad entry refuses its own sample)."""
    bad = (bad,) if isinstance(bad, int) else bad
    index = read_index(str(folder))
    with pytest.raises(CorruptEntryError, match=message) as e:
        index.sample(bad[0])
    text = str(e.value)
    assert str(folder / INDEX_NAME) in text and "hetero index" in text and "hetero prepare" in text, text
    assert e.value.sample == bad[0] and e.value.shard in text
    for i in range(len(index)):
        if i in bad:
            with pytest.raises(CorruptEntryError, match=f"sample {i} "):
                index.sample(i)
        else:
            assert index.sample(i)
    with pytest.raises(ConfigError, match="checksum mismatch"):  # verify reads the whole file: the CRCs first
        verify(str(folder / INDEX_NAME))
    return text


def test_a_good_index_opens_and_reads_the_same_bytes_and_labels(prefix):
    folder, samples = prefix
    index = read_index(str(folder))
    index.check()  # every entry, as verify does
    ds = ShardDataset(str(folder), block_samples=2)
    assert [ds[i] for i in range(len(ds))] == samples
    assert [index.sample(i)[3] for i in range(len(index))] == [label for _, label in samples]
    assert index.parts(0, len(index)) == [(0, index.sample(0)[1], index.sample(2)[1] + index.sample(2)[2]),
                                          (2, index.sample(3)[1], index.sample(6)[1] + index.sample(6)[2])]


@pytest.mark.parametrize("value, byte, label", [
    (127, 0, 127),  # one flipped bit of the low byte
    (0xFF, 3, -16777215),  # the high byte of label 1: a negative label
])
def test_a_flipped_label_byte_is_refused_naming_the_label_and_the_classes(prefix, value, byte, label):
    folder, _ = prefix
    _poke(folder / INDEX_NAME, "labels", 4, value, byte)
    text = _refused(folder, 4, rf"sample 4 of shard shard-000002.tar has label {label}, outside 0..2 \(3 classes\)")
    assert "corrupt" in text


def test_an_offset_past_the_shard_s_end_is_refused_naming_offset_length_and_size(prefix):
    folder, _ = prefix
    size = (folder / "shard-000000.tar").stat().st_size
    _poke(folder / INDEX_NAME, "offsets", 2, size - 10)
    _refused(folder, 2, rf"sample 2 \(offset {size - 10}, length 174: bytes up to {size + 164}\) lies past the "
                        rf"end of shard shard-000000.tar \({size} bytes\)")


def test_a_negative_offset_is_refused(prefix):
    folder, _ = prefix
    _poke(folder / INDEX_NAME, "offsets", 0, -512)
    _refused(folder, 0, r"sample 0 of shard shard-000000.tar starts at offset -512, before the shard's first byte")


def test_two_overlapping_samples_are_refused_naming_both(prefix):
    folder, _ = prefix
    index = open_index_file(str(folder / INDEX_NAME))
    start, length = int(index.offsets[3]), int(index.lengths[3])
    _poke(folder / INDEX_NAME, "offsets", 4, start + 1)  # inside sample 3, still within the shard
    _refused(folder, (3, 4), rf"sample 3 of shard shard-000002.tar \(bytes {start}..{start + length}\) runs into "
                        rf"sample 4, which starts at byte {start + 1}")


def test_samples_out_of_byte_order_are_refused(prefix):
    folder, _ = prefix
    index = open_index_file(str(folder / INDEX_NAME))
    first = int(index.offsets[0])
    _poke(folder / INDEX_NAME, "offsets", 2, first)  # before sample 1, on sample 0's bytes
    _refused(folder, (1, 2), r"sample 1 of shard shard-000000.tar .* runs into sample 2, which starts at byte "
                        rf"{first}")


@pytest.mark.parametrize("length", [0xFFFF_FFFF, 1 << 31])  # -1 as written in a <u4 column; 2 GiB
def test_a_negative_or_huge_length_is_refused_naming_it(prefix, length):
    folder, _ = prefix
    _poke(folder / INDEX_NAME, "lengths", 1, length)
    _refused(folder, 1, rf"sample 1 \(offset \d+, length {length}: .*past the end of shard shard-000000.tar")


def test_the_last_sample_of_a_shard_is_not_compared_with_the_next_shard_s_first(tmp_path):
    # shard 1's first sample starts before shard 0's last one ends, in another file: no overlap
    with IndexWriter(str(tmp_path)) as w:
        w.add_shard("a.tar", 4096, [512, 2048], [1000, 2000], [0, 1])
        w.add_shard("b.tar", 4096, [512], [100], [2])
        w.write_file(str(tmp_path / INDEX_NAME), CLASSES)
    index = read_index(str(tmp_path))
    index.check()
    assert index.sample(2) == (1, 512, 100, 2)


def test_a_bad_entry_at_a_chunk_boundary_is_found(prefix, monkeypatch):
    folder, _ = prefix
    monkeypatch.setattr(shard_format, "CHECK_CHUNK", 2)  # samples 3 and 4 in different chunks
    index = open_index_file(str(folder / INDEX_NAME))
    start = int(index.offsets[3])
    _poke(folder / INDEX_NAME, "offsets", 4, start + 1)
    with pytest.raises(ConfigError, match=r"sample 3 of shard shard-000002.tar .* runs into sample 4"):
        read_index(str(folder)).check()


@pytest.mark.parametrize("i", [-1, -7, 7, 8, 1 << 40])
def test_a_sample_number_outside_the_index_is_an_index_error_naming_it(prefix, i):
    folder, _ = prefix
    index = read_index(str(folder))
    with pytest.raises(IndexError, match=rf"sample {i} is outside 0\.\.6: the index holds 7 samples"):
        index.sample(i)
    with pytest.raises(IndexError, match=rf"sample {i} is outside 0\.\.6"):
        index.shard_at(i)


def test_a_block_outside_the_index_is_an_index_error_naming_it(prefix):
    index = read_index(str(prefix[0]))
    with pytest.raises(IndexError, match=r"samples -1\.\.0 are outside 0\.\.6: the index holds 7 samples"):
        index.parts(-1, 1)
    with pytest.raises(IndexError, match=r"samples 6\.\.7 are outside 0\.\.6"):
        index.parts(6, 8)


def test_a_shard_is_checked_once_at_its_first_use_and_others_still_read(prefix):
    folder, samples = prefix
    _poke(folder / INDEX_NAME, "labels", 0, 3)
    index = read_index(str(folder))  # opening reads no per-sample entry
    reads = []
    values = index.reader.values
    index.reader.values = lambda *a: reads.append(a) or values(*a)
    assert index.sample(5)[3] == samples[5][1]  # shard 2 is sound
    assert index.sample(6)[3] == samples[6][1]
    assert len(reads) == 3  # its three columns, read once
    with pytest.raises(CorruptEntryError, match="sample 0 of shard shard-000000.tar has label 3"):
        index.sample(0)
    assert index.sample(2)[3] == samples[2][1]  # the bad entry refuses its own sample only
    assert len(reads) == 6


def test_an_index_json_with_a_bad_label_is_refused_when_read(tmp_path):
    index = ShardIndex(CLASSES, [ShardInfo("a.tar", 4096, 0, 2)], np.array([512, 2048]), np.array([100, 100]),
                       np.array([0, 3]))
    (tmp_path / JSON_INDEX_NAME).write_bytes(index.to_json())
    with pytest.raises(ConfigError, match=rf"{JSON_INDEX_NAME}: sample 1 of shard a.tar has label 3, outside 0..2"):
        read_index(str(tmp_path))


def test_an_index_without_class_names_needs_labels_of_0_and_up(tmp_path):
    with IndexWriter(str(tmp_path)) as w:
        w.add_shard("a.tar", 4096, [512, 2048], [100, 100], [0, 41])
        w.write_file(str(tmp_path / INDEX_NAME), [])
    assert read_index(str(tmp_path)).sample(1)[3] == 41
    _poke(tmp_path / INDEX_NAME, "labels", 0, -1)
    with pytest.raises(ConfigError, match=r"sample 0 of shard a.tar has label -1, outside 0 and up"):
        read_index(str(tmp_path)).sample(0)


def test_overlapping_samples_are_refused_when_written(tmp_path):
    with IndexWriter(str(tmp_path)) as w, pytest.raises(ConfigError, match=r"shard s.tar: sample 0 \(bytes "
                                                                             r"512\.\.1024\) runs into sample 1 "
                                                                             r"\(at byte 1000\)"):
        w.add_shard("s.tar", 4096, [512, 1000], [512, 100], [0, 1])
