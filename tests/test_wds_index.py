"""``hetero index``: WebDataset tars written by other tools indexed in one read, read in place by ShardDataset.

Tars come from the ``webdataset`` library's own writer and from ``tarfile`` in GNU and pax formats
(long names, subfolders); every sample's bytes read through the index equal what was written, the
source files stay untouched, each shard is read once, and every kind of damage is a clear error
or a counted skip.
"""
from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from data_service.errors import ConfigError
from data_service.shards import ShardDataset
from data_service.shards.format import INDEX_NAME
from data_service.shards.indexfile import read_index
from data_service.shards.labels import LabelRule
from data_service.shards.wds_index import expand, index_tars, split_source
from data_service.storage import LocalStore
from hetero.cli import main


def _wds(path: Path, samples: list[dict]) -> None:
    import webdataset as wds

    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as w:
        for s in samples:
            w.write(s)


def _tar(path: Path, members: list[tuple[str, bytes]], fmt=tarfile.GNU_FORMAT) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def _blob(k: int) -> bytes:
    return hashlib.sha256(str(k).encode()).digest() * (3 + k % 7)


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_webdataset_writer_tars_with_json_labels_read_in_place_exactly_once(tmp_path):
    """The library's writer, its key scheme (dots in keys' folders, keys with dashes), .json labels
    by class name, shards in subfolders; the index elsewhere; every sample once, sources untouched."""
    src, dest = tmp_path / "laion", tmp_path / "idx"
    written = []
    for s in range(3):
        samples = []
        for i in range(4 + s):
            key = f"part.v1/{s:05d}-{i:04d}"
            cls = ["cat", "dog", "emu"][(s + i) % 3]
            samples.append({"__key__": key, "jpg": _blob(10 * s + i), "txt": "a caption",
                            "json": {"meta": {"label": cls}, "url": "http://x"}})
            written.append((_blob(10 * s + i), cls))
        _wds(src / f"g{s % 2}" / f"{s:06d}.tar", samples)
    before = _digest(src)
    summary = index_tars(str(src), str(dest), label="json:meta.label", classes=["emu", "dog", "cat"])
    assert _digest(src) == before and not (src / INDEX_NAME).exists()
    assert summary.samples == len(written) and summary.shards == 3 and not summary.skipped
    assert summary.bytes_read <= sum(p.stat().st_size for p in src.rglob("*.tar"))
    ds = ShardDataset(str(src), index=str(dest), block_samples=4)
    assert ds.classes == ["emu", "dog", "cat"]
    names = [ds.index.shards.name(k) for k in range(3)]
    assert names == ["g0/000000.tar", "g0/000002.tar", "g1/000001.tar"]  # sorted paths, subfolders kept
    got = sorted((ds[i][0], ds.classes[ds[i][1]]) for i in range(len(ds)))
    assert got == sorted(written)


def test_each_shard_is_read_once_front_to_back(tmp_path):
    src = tmp_path / "src"
    for s in range(2):
        _tar(src / f"s{s}.tar", [(f"{k:03d}.{ext}", _blob(k) if ext == "png" else b"%d" % (k % 5))
                                 for k in range(40) for ext in ("cls", "png")])
    store = LocalStore(str(src))
    index_tars(store, str(tmp_path / "idx"))
    sizes = sum(p.stat().st_size for p in src.glob("*.tar"))
    assert store.bytes_read <= sizes and store.requests == 2  # one ranged read per (small) shard


def test_long_names_pax_records_and_a_brace_pattern(tmp_path):
    src = tmp_path / "src"
    deep = "d" * 120 + "/ü-key"  # over 100 bytes, and not ASCII: GNU 'L' / pax 'path' records
    _tar(src / "shard-000.tar", [(f"{deep}.jpg", b"A" * 700), (f"{deep}.cls", b"2")], fmt=tarfile.GNU_FORMAT)
    _tar(src / "shard-001.tar", [(f"{deep}.webp", b"B" * 10), (f"{deep}.cls", b"1")], fmt=tarfile.PAX_FORMAT)
    _tar(src / "shard-002.tar", [("x.jpg", b"C"), ("x.cls", b"0")])
    assert expand("shard-{000..001}.tar") == ["shard-000.tar", "shard-001.tar"]
    assert split_source(f"{src}/shard-{{000..001}}.tar") == (str(src), "shard-{000..001}.tar")
    assert split_source("s3://b/p/one.tar") == ("s3://b/p", "one.tar") and split_source("x.tar") == (".", "x.tar")
    assert split_source("s3://b/p") == ("s3://b/p", "")
    assert main(["index", f"{src}/shard-{{000..001}}.tar"]) == 0
    ds = ShardDataset(str(src), block_samples=2)
    assert [ds[i] for i in range(len(ds))] == [(b"A" * 700, 2), (b"B" * 10, 1)]
    assert ds.classes == ["0", "1", "2"]


def test_label_rules_and_classes():
    rule = LabelRule("txt")
    assert [rule.label(x, "s") for x in (b"dog\n", b"cat", b"dog")] == [0, 1, 0]
    assert rule.final_classes() == ["dog", "cat"]
    with pytest.raises(ConfigError, match="class index 3 among class names"):
        rule.label(b"3", "s")
    rule = LabelRule("json:y", classes=["a", "b"])
    assert rule.label(b'{"y": "b"}', "s") == 1 and rule.label(b'{"y": 0}', "s") == 0
    with pytest.raises(ConfigError, match="'z' is not among the classes"):
        rule.label(b'{"y": "z"}', "s")
    with pytest.raises(ConfigError, match="no label by the rule 'json:y'"):
        rule.label(b'{"x": 1}', "s")
    with pytest.raises(ConfigError, match="label='json' must be"):
        LabelRule("json")


@pytest.mark.parametrize("damage, reason", [
    ("no_label", "without a label member"), ("gif", "of unsupported image types"),
    ("truncated", "damaged shard(s)"), ("bad_header", "damaged shard(s)"),
])
def test_damage_is_a_clear_error_or_a_counted_skip(tmp_path, damage, reason):
    src = tmp_path / "src"
    good = [(f"{k:03d}.{e}", _blob(k) if e == "jpg" else b"1") for k in range(6) for e in ("jpg", "cls")]
    members = list(good)
    if damage == "no_label":
        members.insert(4, ("002b.jpg", b"x"))
    if damage == "gif":
        members.insert(4, ("002b.gif", b"GIF89a"))
        members.insert(5, ("002b.cls", b"0"))
    _tar(src / "a.tar", members)
    path = src / "a.tar"
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[:512 * 9 + 100])  # inside the 5th member's data
    if damage == "bad_header":
        path.write_bytes(raw[:512 * 8] + b"garbage!" + raw[512 * 8 + 8:])
    with pytest.raises(ConfigError) as err:
        index_tars(str(src), str(tmp_path / "i1"))
    text = str(err.value)
    assert "a.tar" in text and "--on-corrupt skip" in text
    summary = index_tars(str(src), str(tmp_path / "i2"), on_corrupt="skip")
    assert reason in summary.skipped and summary.examples
    ds = ShardDataset(str(src), index=str(tmp_path / "i2"))
    kept = [k for k in range(6) if damage not in ("truncated", "bad_header") or k < 2]  # 002 is cut
    assert len(ds) == len(kept) and all(ds[i][0] == _blob(k) for i, k in enumerate(kept))


def test_compressed_tar_and_an_empty_source_are_refused_with_the_fix(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with pytest.raises(ConfigError, match="no .tar files there"):
        index_tars(str(src))
    with tarfile.open(src / "a.tar", "w:gz") as t:
        info = tarfile.TarInfo("x.jpg")
        t.addfile(info, io.BytesIO(b""))
    with pytest.raises(ConfigError, match="gzip-compressed: ranged reads need a plain .tar"):
        index_tars(str(src))


def test_a_path_that_does_not_exist_is_named_as_such(tmp_path, capsys):
    gone = tmp_path / "nonexistent"
    assert main(["index", str(gone), "--quiet"]) == 2
    out = "".join(capsys.readouterr())
    assert f"{gone}: no such path: it does not exist" in out and "no .tar files there" not in out
    assert main(["index", str(gone / "shard-{000..002}.tar"), "--quiet"]) == 2
    assert f"{gone}: no such path" in "".join(capsys.readouterr())


@pytest.mark.parametrize("members, fix", [
    ([("k.jpg", b"1"), ("k.json", b'{"label": 3}')], "pass --label json:FIELD"),
    ([("k.jpg", b"1"), ("k.txt", b"cat")], "pass --label txt"),
])
def test_labels_in_another_member_name_the_label_rule_to_pass(tmp_path, capsys, members, fix):
    src = tmp_path / "src"
    _tar(src / "a.tar", members)
    assert main(["index", str(src), "--quiet"]) == 2
    out = "".join(capsys.readouterr())
    assert "no .cls member" in out and fix in out, out


def test_an_existing_index_is_kept_unless_overwrite(tmp_path, capsys):
    src = tmp_path / "src"
    _tar(src / "a.tar", [("k.jpg", b"1"), ("k.cls", b"0")])
    assert main(["index", str(src), "--to", str(tmp_path / "idx")]) == 0
    assert f"pipeline.shards={src} --hp pipeline.index={tmp_path / 'idx'}" in "".join(capsys.readouterr())
    assert main(["index", str(src), "--to", str(tmp_path / "idx")]) == 2
    assert "already holds an index; pass --overwrite" in "".join(capsys.readouterr())
    assert main(["index", str(src), "--to", str(tmp_path / "idx"), "--overwrite", "--classes", "only"]) == 0
    assert read_index(str(tmp_path / "idx")).classes == ["only"]


def test_the_index_of_prepared_shards_equals_prepare_s_own(tmp_path):
    """``hetero index`` over ``hetero prepare``'s tars gives the same columns, so the same bytes."""
    from data_service.prepare.writer import prepare


    root = tmp_path
    os.makedirs(root / "src/a")
    os.makedirs(root / "src/b")
    for k in range(16):
        (root / "src" / "ab"[k % 2] / f"{k}.jpg").write_bytes(_jpeg(k))
    prepare(str(root / "src"), str(root / "shards"), shard_size=1_000_000, workers=1, progress=False,
            verify=False)
    index_tars(str(root / "shards"), str(root / "idx"), classes=["a", "b"])
    mine, theirs = read_index(str(root / "idx")), read_index(str(root / "shards"))
    assert len(mine.shards) == len(theirs.shards) > 1
    for col in ("offsets", "lengths", "labels"):
        assert np.array_equal(getattr(mine, col), getattr(theirs, col)), col
    assert mine.classes == theirs.classes == ["a", "b"]


def _jpeg(k: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    noise = np.random.default_rng(k).integers(0, 255, (256, 240 + k, 3), dtype=np.uint8)  # ~150 KB: 3 shards
    Image.fromarray(noise).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def test_a_tar_changed_after_indexing_is_refused_at_start(tmp_path):
    src = tmp_path / "src"
    _tar(src / "a.tar", [("k.jpg", b"1"), ("k.cls", b"0")])
    index_tars(str(src), str(tmp_path / "idx"))
    _tar(src / "a.tar", [("k.jpg", b"1"), ("k.cls", b"0"), ("l.jpg", bytes(20000)), ("l.cls", b"0")])
    with pytest.raises(ConfigError, match="wrong size.*index them again with `hetero index`"):
        ShardDataset(str(src), index=str(tmp_path / "idx"))


def test_from_json_converts_an_index_json_to_index_bin(tmp_path, capsys):
    from data_service.shards.format import JSON_INDEX_NAME

    src = tmp_path / "src"
    _tar(src / "a.tar", [("k.jpg", b"12"), ("k.cls", b"1"), ("l.png", b"345"), ("l.cls", b"0")])
    index_tars(str(src), str(tmp_path / "bin"))
    (src / JSON_INDEX_NAME).write_bytes(read_index(str(tmp_path / "bin")).to_json())
    assert main(["index", "--from-json", str(src)]) == 0
    assert "index.bin" in "".join(capsys.readouterr()) and (src / INDEX_NAME).exists()
    assert [ShardDataset(str(src))[i] for i in range(2)] == [(b"12", 1), (b"345", 0)]
    assert main(["index", "--from-json", str(tmp_path / "bin")]) == 2
    assert "no index.json" in "".join(capsys.readouterr())


def test_members_without_an_extension_and_hidden_ones_are_not_samples(tmp_path):
    src = tmp_path / "src"
    _tar(src / "a.tar", [("README", b"about"), ("._k.jpg", b"mac"), ("k.jpg", b"1"), ("k.cls", b"0"),
                         ("d/._l.jpg", b"mac"), ("d/l.jpg", b"22"), ("d/l.cls", b"1")])
    assert index_tars(str(src)).samples == 2
    assert [ShardDataset(str(src))[i] for i in range(2)] == [(b"1", 0), (b"22", 1)]


def test_a_pattern_is_checked_against_one_listing(tmp_path):
    src = tmp_path / "src"
    for k in (0, 1, 3):
        _tar(src / "p" / f"s-{k}.tar", [("k.jpg", b"%d" % k), ("k.cls", b"0")])
    store = LocalStore(str(src))
    with pytest.raises(ConfigError, match=r"1 of the 4 shard\(s\) the pattern 'p/s-\{0..3\}.tar' names are not "
                                          r"there \(p/s-2.tar\)"):
        index_tars(store, str(tmp_path / "idx"), pattern="p/s-{0..3}.tar")
    assert index_tars(store, str(tmp_path / "idx"), pattern="p/s-{0..1}.tar").shards == 2


def test_a_class_index_outside_the_classes_given_is_a_bad_label():
    rule = LabelRule("cls", classes=["a", "b"])
    with pytest.raises(ConfigError, match=r"class index 2 is outside 0..1 \(the classes given\)"):
        rule.label(b"2", "s")
    with pytest.raises(ConfigError, match="class index -1 is outside 0 and up"):
        LabelRule("cls").label(b"-1", "s")


@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar"])
def test_tars_written_by_gnu_tar_in_each_format(tmp_path, fmt):
    import shutil
    import subprocess

    if not shutil.which("tar"):
        pytest.skip("no tar command")
    files = tmp_path / "files"
    (files / "dir").mkdir(parents=True)
    for k in range(3):
        (files / "dir" / f"{k:04d}.png").write_bytes(_blob(k))
        (files / "dir" / f"{k:04d}.cls").write_text(str(k))
    (tmp_path / "src").mkdir()
    subprocess.run(["tar", f"--format={fmt}", "-cf", str(tmp_path / "src" / "a.tar"), "-C", str(files), "dir"],
                   check=True)
    index_tars(str(tmp_path / "src"))
    ds = ShardDataset(str(tmp_path / "src"))
    assert sorted(ds[i] for i in range(len(ds))) == [(_blob(k), k) for k in range(3)]


def test_members_of_a_sample_apart_and_a_key_repeated(tmp_path):
    src = tmp_path / "src"
    _tar(src / "a.tar", [("b.cls", b"1"), ("a.jpg", b"A"), ("c.jpg", b"C"), ("b.jpg", b"B"), ("a.cls", b"0"),
                         ("c.cls", b"2"), ("d.jpg", b"D1"), ("d.cls", b"0"), ("d.jpg", b"D2")])
    with pytest.raises(ConfigError, match="sample 'd' has more than one .jpg member"):
        index_tars(str(src), str(tmp_path / "i1"))
    summary = index_tars(str(src), str(tmp_path / "i2"), on_corrupt="skip")
    assert summary.skipped == {"with repeated members": 1}
    ds = ShardDataset(str(src), index=str(tmp_path / "i2"))
    assert [ds[i] for i in range(len(ds))] == [(b"A", 0), (b"C", 2), (b"B", 1)]  # in the images' order


@pytest.mark.parametrize("kind", [b"0", b"5"])
@pytest.mark.parametrize("size_field", [b"\xff" * 12, b"\xff" + b"\xff" * 9 + b"\xfc\x00"])
def test_a_negative_member_size_is_a_tar_error(size_field, kind):
    from data_service.shards.tarwalk import ForwardReader, TarError, members

    header = bytearray(512)
    header[0:5] = b"a.jpg"
    header[124:136] = size_field
    header[156:157] = kind
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    raw = bytes(header) + bytes(1024)

    class Bytes:
        def read(self, key, a, b):
            return raw[a:b]

    walk = members(ForwardReader(Bytes(), "x.tar", len(raw)), lambda name: True)
    with pytest.raises(TarError, match="size"):
        for _ in zip(range(10), walk):
            pass


def test_a_pax_size_that_is_not_a_number_is_a_tar_error():
    from data_service.shards.tarwalk import ForwardReader, TarError, members

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.jpg")
        info.size = 3
        info.pax_headers = {"comment": "x"}
        tar.addfile(info, io.BytesIO(b"abc"))
    raw = buf.getvalue().replace(b"comment=x", b"size=zz ", 1)
    assert b"size=zz" in raw

    class Bytes:
        def read(self, key, a, b):
            return raw[a:b]

    with pytest.raises(TarError, match="size"):
        list(members(ForwardReader(Bytes(), "x.tar", len(raw)), lambda name: True))


def test_a_long_name_or_pax_record_past_its_limit_is_a_tar_error():
    from data_service.shards import tarwalk

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.jpg")
        info.size = 3
        info.pax_headers = {"comment": "x" * (tarwalk.MAX_RECORD + 1)}
        tar.addfile(info, io.BytesIO(b"abc"))
    raw = buf.getvalue()

    class Bytes:
        def read(self, key, a, b):
            return raw[a:b]

    with pytest.raises(tarwalk.TarError, match="record of"):
        list(tarwalk.members(tarwalk.ForwardReader(Bytes(), "x.tar", len(raw)), lambda name: True))


def test_a_label_member_over_its_cap_is_refused_unread_or_skipped(tmp_path, monkeypatch):
    """A label member is read into memory: one over ``MAX_LABEL_BYTES`` is never read; the error names
    the shard, the member, its size and the cap (or with --on-corrupt skip its sample is left out)."""
    from data_service.shards import tarwalk, wds_index

    monkeypatch.setattr(wds_index, "MAX_LABEL_BYTES", 64)
    src = tmp_path / "src"
    big = b'{"label": 1, "pad": "' + b"x" * 200 + b'"}'
    _tar(src / "a.tar", [("000.jpg", _blob(0)), ("000.json", b'{"label": 0}'),
                         ("001.jpg", _blob(1)), ("001.json", big),
                         ("002.jpg", _blob(2)), ("002.json", b'{"label": 1}')])
    with pytest.raises(ConfigError, match=rf"a.tar.*001.json.* {len(big)} bytes.*64.*--on-corrupt skip"):
        index_tars(str(src), str(tmp_path / "i1"), label="json:label")
    summary = index_tars(str(src), str(tmp_path / "i2"), label="json:label", on_corrupt="skip")
    assert summary.skipped == {"with an oversized label member": 1}
    assert "skipped: 1 with an oversized label member (e.g. " in summary.lines()[1]
    ds = ShardDataset(str(src), index=str(tmp_path / "i2"))
    assert [ds[i] for i in range(len(ds))] == [(_blob(0), 0), (_blob(2), 1)]
    raw = (src / "a.tar").read_bytes()

    class Bytes:
        def read(self, key, a, b):
            return raw[a:b]

    walked = {m.name: m for m in tarwalk.members(tarwalk.ForwardReader(Bytes(), "a.tar", len(raw)),
                                                 lambda name: name.endswith(".json"), max_data=64)}
    assert walked["001.json"].data is None and walked["001.json"].size == len(big)
    assert walked["002.json"].data == b'{"label": 1}'


def _samples_tar(path: Path, n: int = 6) -> dict[str, tarfile.TarInfo]:
    """A shard of ``n`` samples (``000.jpg``, ``000.cls``, ...) and its members by name (offsets)."""
    _tar(path, [(f"{k:03d}.{e}", _blob(k) if e == "jpg" else b"%d" % (k % 3))
                for k in range(n) for e in ("jpg", "cls")])
    with tarfile.open(path) as t:
        return {m.name: m for m in t.getmembers()}


@pytest.mark.parametrize("where", ["003.jpg data", "003.cls header", "003.cls data"])
def test_a_shard_cut_inside_its_4th_sample_keeps_the_3_whole_ones(tmp_path, capsys, where):
    src = tmp_path / "src"
    found = _samples_tar(src / "a.tar")
    member, part = where.split()
    info = found[member]
    path = src / "a.tar"
    path.write_bytes(path.read_bytes()[:info.offset_data + info.size // 2 if part == "data" else info.offset + 100])
    with pytest.raises(ConfigError) as err:
        index_tars(str(src), str(tmp_path / "i1"))
    text = str(err.value)
    assert "a.tar" in text and "'003'" in text and f"at byte {info.offset}" in text, text
    assert "--on-corrupt skip" in text
    summary = index_tars(str(src), str(tmp_path / "i2"), on_corrupt="skip")
    assert summary.samples == 3 and summary.skipped == {"damaged shard(s)": 1} and not summary.unended
    ds = ShardDataset(str(src), index=str(tmp_path / "i2"))
    assert [ds[i] for i in range(len(ds))] == [(_blob(k), k % 3) for k in range(3)]
    assert main(["index", str(src), "--to", str(tmp_path / "i3"), "--on-corrupt", "skip", "--quiet"]) == 0
    out = "".join(capsys.readouterr())
    assert "indexed 3 samples" in out and "skipped: 1 damaged shard(s)" in out and "'003'" in out, out
    assert "its 3 whole sample(s) indexed" in out, out


@pytest.mark.parametrize("tail", [0, 512, 700])
def test_a_shard_cut_at_a_member_boundary_is_named_and_keeps_its_whole_samples(tmp_path, capsys, tail):
    """No end-of-archive blocks (or only part of them) after sample 002's last member, as after an
    interrupted upload: samples 000-002 are indexed, the shard named and counted; --strict refuses it."""
    src = tmp_path / "src"
    found = _samples_tar(src / "a.tar")
    _samples_tar(src / "b.tar", 2)
    path = src / "a.tar"
    path.write_bytes(path.read_bytes()[:found["003.jpg"].offset] + bytes(tail))
    assert main(["index", str(src), "--to", str(tmp_path / "i1"), "--quiet"]) == 0
    out = "".join(capsys.readouterr())
    assert "indexed 5 samples" in out and "skipped" not in out, out
    assert "1 shard(s) without their end-of-archive blocks: a.tar (" in out and "upload them again" in out, out
    ds = ShardDataset(str(src), index=str(tmp_path / "i1"))
    assert [ds[i][0] for i in range(len(ds))] == [_blob(k) for k in (0, 1, 2, 0, 1)]
    assert main(["index", str(src), "--to", str(tmp_path / "i2"), "--quiet", "--strict"]) == 2
    out = "".join(capsys.readouterr())
    assert "a.tar: the file ends without its end-of-archive blocks" in out and "upload the shard again" in out, out
    assert not (tmp_path / "i2" / INDEX_NAME).exists()


def test_a_shard_cut_between_the_members_of_a_sample_names_it(tmp_path):
    """Cut after ``003.jpg``, before ``003.cls``: sample 003 is the cut one, 000-002 are whole."""
    src = tmp_path / "src"
    found = _samples_tar(src / "a.tar")
    path = src / "a.tar"
    path.write_bytes(path.read_bytes()[:found["003.cls"].offset])
    with pytest.raises(ConfigError, match=r"a.tar sample '003' has no .cls member.*without its end-of-archive "
                                          r"blocks.*upload the shard again"):
        index_tars(str(src), str(tmp_path / "i1"))
    summary = index_tars(str(src), str(tmp_path / "i2"), on_corrupt="skip")
    assert summary.samples == 3 and summary.skipped == {"cut short by their shard's end": 1}
    assert summary.unended == ["a.tar"]


def test_an_intact_shard_is_not_named_as_cut_even_with_strict(tmp_path, capsys):
    src = tmp_path / "src"
    _samples_tar(src / "a.tar")
    _wds(src / "b.tar", [{"__key__": "k", "jpg": b"1", "cls": b"0"}])
    assert main(["index", str(src), "--quiet", "--strict"]) == 0
    out = "".join(capsys.readouterr())
    assert "indexed 7 samples" in out and "end-of-archive" not in out and "skipped" not in out, out


def test_an_existing_index_fails_at_once_before_any_shard_is_listed_or_a_bar_shown(tmp_path, capsys, monkeypatch):
    from data_service.shards import wds_index

    src = tmp_path / "src"
    _tar(src / "a.tar", [("k.jpg", b"1"), ("k.cls", b"0")])
    assert main(["index", str(src), "--quiet"]) == 0
    capsys.readouterr()

    def listed(*_a, **_k):
        raise AssertionError("the shards were listed before the destination was checked")
    monkeypatch.setattr(wds_index, "list_shards", listed)
    assert main(["index", str(src)]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [f"hetero index: {src} already holds an index; pass --overwrite to replace it, "
                                    "or --to another place"]  # the one line, and no progress bar
    assert out.out == ""


def test_the_progress_bar_counts_bytes_of_the_total(tmp_path, capsys):
    src = tmp_path / "src"
    for k in range(3):
        _tar(src / f"{k}.tar", [(f"k{k}.jpg", b"1" * 5000), (f"k{k}.cls", b"0")])
    total = sum(p.stat().st_size for p in src.glob("*.tar"))
    assert main(["index", str(src), "--to", str(tmp_path / "idx")]) == 0
    err = capsys.readouterr().err.replace("\r", "\n")
    from tqdm import tqdm

    assert "indexing shards: 100%" in err and f"/{tqdm.format_sizeof(total)}" in err, err


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "--workers 0: give at least 1"),
    (["--image", "gif"], "--image 'gif': give image extensions among jpg,jpeg,png,webp"),
    (["--label", "json:"], "label='json:'"),
])
def test_bad_options_fail_before_a_bar_is_shown(tmp_path, capsys, argv, message):
    src = tmp_path / "src"
    _tar(src / "a.tar", [("k.jpg", b"1"), ("k.cls", b"0")])
    assert main(["index", str(src), *argv]) == 2
    out = capsys.readouterr()
    assert message in out.err and len(out.err.splitlines()) == 1 and out.out == "", out  # no bar
