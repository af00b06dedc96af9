"""What the corruption campaign (``python -m benchmarks.corruption``) damages, and how.

The data sets (photo-like JPEGs as ``hetero prepare`` shards, as WebDataset tars indexed by
``hetero index``, as a Parquet file with page CRCs, and as one written with pyarrow's defaults, no
page CRCs, checksummed by ``hetero index``); :class:`Damage`, a byte flip or cut done in place (so
servers holding the file open see it) and undone after the trial, and :class:`Zeroed`, a run of
bytes zeroed; one function per place choosing the damage at random (``shard_damage``,
``index_damage``, ``cached_damage``, ``parquet_damage``, ``decoded_damage``,
``plain_parquet_damage``, ``label_manifest_damage``, ``label_index_damage``); and :class:`FlipProxy`,
a loopback TCP proxy that flips one byte of what a data server sends, or of what its consumer sends
(its requests), on one connection or on every one.
"""
from __future__ import annotations

import io
import json
import os
import random
import socket
import tarfile
import threading
import time
from pathlib import Path

PIPELINE = "data_service.pipelines.images:build_pipeline"


def photos(root: str, count: int) -> list[tuple[str, int]]:
    """``count`` photo-like JPEGs under ``root`` (class folders); (path, class index) in sorted order."""
    from benchmarks.photos import write_photo_folder

    write_photo_folder(root, count)
    classes = sorted(d.name for d in Path(root).iterdir() if d.is_dir())
    return [(str(p), classes.index(p.parent.name)) for p in sorted(Path(root).glob("*/*.jpg"))]


def prepared(photo_root: str, dest: str) -> str:
    """``hetero prepare``'s shards of ``photo_root`` (several small shards)."""
    from data_service.prepare.writer import prepare

    if not os.path.exists(os.path.join(dest, "index.bin")):
        prepare(photo_root, dest, shard_size=1 << 20, workers=1, progress=False)
    return dest


def webdataset(files: list[tuple[str, int]], dest: str, per_shard: int = 32) -> str:
    """WebDataset tars (``NNNNNN.jpg`` + ``NNNNNN.cls``) of ``files``, indexed in place by ``hetero index``."""
    from data_service.shards.wds_index import index_tars

    os.makedirs(dest, exist_ok=True)
    for s in range(0, len(files), per_shard):
        with tarfile.open(os.path.join(dest, f"shard-{s // per_shard:06d}.tar"), "w") as tar:
            for n, (path, label) in enumerate(files[s:s + per_shard], start=s):
                tar.add(path, arcname=f"{n:06d}.jpg")
                cls = f"{label}".encode()
                info = tarfile.TarInfo(f"{n:06d}.cls")
                info.size = len(cls)
                tar.addfile(info, io.BytesIO(cls))
    index_tars(dest, workers=1, overwrite=True)
    return dest


def parquet(files: list[tuple[str, int]], dest: str, row_group: int = 16) -> str:
    """One Parquet file of ``files`` (image bytes, label), plain uncompressed pages with CRCs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, "train-00000.parquet")
    table = pa.table({"image": pa.array([Path(p).read_bytes() for p, _ in files], pa.binary()),
                      "label": pa.array([y for _, y in files], pa.int64())})
    pq.write_table(table, path, row_group_size=row_group, compression="none", use_dictionary=False,
                   write_page_checksum=True)
    return path


class Damage:
    """One flip (XOR ``mask`` at ``at``) or cut (to ``at`` bytes) of ``path``, undone by :meth:`undo`
    where the file is still the one damaged (a reader that dropped it made a new one)."""

    def __init__(self, path: str, at: int, mask: int = 0, cut: bool = False) -> None:
        self.path, self.at, self.mask, self.cut = path, at, mask, cut
        st = os.stat(path)
        self.inode, self.size = st.st_ino, st.st_size
        with open(path, "r+b") as f:
            f.seek(at)
            self.tail = f.read() if cut else f.read(1)
            if cut:
                f.truncate(at)
            else:
                f.seek(at)
                f.write(bytes([self.tail[0] ^ mask]))  # in place: readers holding the file see it

    def undo(self) -> None:
        try:
            if os.stat(self.path).st_ino != self.inode:
                return
        except FileNotFoundError:
            return
        with open(self.path, "r+b") as f:
            f.seek(self.at)
            f.write(self.tail)


class FlipProxy:
    """Forwards 127.0.0.1:<port> to ``target``; once armed, flips the byte at ``offset`` of the next
    connection's server -> client stream (``mask`` XORed; ``requests``: of its client -> server
    stream), then forwards faithfully again; with ``every``, the same byte of every connection
    from then on (a link that damages each one alike).

    ``flipped`` counts flips and ``flipped_at`` holds their ``time.monotonic()``; ``sent`` is the
    client -> server bytes of the latest connection so far, and ``head`` their first
    ``HEAD_BYTES`` (where a request's frames lie)."""

    HEAD_BYTES = 4096

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._lst = socket.create_server(("127.0.0.1", 0))
        self.port = self._lst.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: tuple[int, int, bool] | None = None
        self._every = False
        self.flipped = 0
        self.flipped_at: list[float] = []
        self.sent = 0
        self.head = bytearray()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, offset: int, mask: int, requests: bool = False, every: bool = False) -> None:
        with self._lock:
            self._armed, self._every = (offset, mask, requests), every

    def disarm(self) -> None:
        with self._lock:
            self._armed, self._every = None, False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._lst.accept()
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                return
            with self._lock:
                armed = self._armed
                if not self._every:
                    self._armed = None
                self.sent, self.head = 0, bytearray()
            flip = armed[:2] if armed else None
            up, down = (flip, None) if armed and armed[2] else (None, flip)
            threading.Thread(target=self._pipe, args=(client, upstream, up, self.head), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, down, None), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, flip: tuple[int, int] | None,
              head: bytearray | None) -> None:
        seen = 0
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if flip is not None and seen <= flip[0] < seen + len(data):
                    data = bytearray(data)
                    data[flip[0] - seen] ^= flip[1]
                    self.flipped += 1
                    self.flipped_at.append(time.monotonic())
                if head is not None and head is self.head:  # the latest connection's requests
                    head += data[:max(0, self.HEAD_BYTES - len(head))]
                    self.sent += len(data)
                seen += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._lst.close()


def samples_hit(index, shard: str, at: int, cut: bool = False) -> int:
    """How many samples of ``shard`` a flip of byte ``at`` (or a cut there) damages."""
    import numpy as np

    k = [index.shards.name(j) for j in range(len(index.shards))].index(shard)
    a, b = int(index.shards.first[k]), int(index.shards.first[k + 1])
    off, ln = np.asarray(index.offsets[a:b]), np.asarray(index.lengths[a:b])
    return int(np.count_nonzero(off + ln > at if cut else (off <= at) & (at < off + ln)))


def shard_damage(rng: random.Random, folder: str) -> tuple[list, int]:
    """A flip anywhere in one shard (4 in 5), or a cut of it; with the samples it damages."""
    from data_service.shards.indexfile import read_index

    index = read_index(folder)
    name = index.shards.name(rng.randrange(len(index.shards)))
    path = os.path.join(folder, name)
    size = os.path.getsize(path)
    if rng.random() < 0.2:  # a cut: every sample from there on is damaged
        at = rng.randrange(512, size)
        return [Damage(path, at, cut=True)], samples_hit(index, name, at, cut=True)
    at = rng.randrange(size)
    return [Damage(path, at, 1 << rng.randrange(8))], samples_hit(index, name, at)


def index_damage(rng: random.Random, folder: str) -> tuple[list, int]:
    """A flip in index.bin's per-sample columns (offsets, lengths, labels, checksums)."""
    from data_service.shards.indexfile import PREFIX

    path = os.path.join(folder, "index.bin")
    with open(path, "rb") as f:
        head = PREFIX.unpack(f.read(PREFIX.size))
        header = json.loads(f.read(head[2]))
    name = rng.choice(["offsets", "lengths", "labels", "checksums"])
    col = header["columns"][name]
    width = int(col["dtype"][-1])
    base = -(-(PREFIX.size + head[2]) // 64) * 64  # the columns start at the next 64-byte boundary
    at = base + int(col["at"]) + rng.randrange(int(col["count"]) * width)
    return [Damage(path, at, 1 << rng.randrange(8))], 1


def cached_damage(rng: random.Random, local: str, cache: str, block_samples: int, s3=None) -> tuple[list, int]:
    """A flip in a cached S3 block (the node's disk); with ``s3`` the same byte flipped in the S3 object
    too, as the first GET of a damaged object would have cached it, so the re-read meets the damage."""
    from data_service.shards import ShardDataset

    ds = ShardDataset(local, block_samples=block_samples)
    i = rng.randrange(len(ds))
    shard, start, length, _ = ds.index.sample(i)
    at = start + rng.randrange(length)
    block, pos = i // ds.block_samples, 0
    for k, a, b in ds.block_parts(block):
        if k == shard:
            pos += at - a
            break
        pos += b - a
    mask = 1 << rng.randrange(8)
    files = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f == ds._name(block)]
    damage = [Damage(f, pos, mask) for f in files]
    if s3 is not None:
        client, bucket, prefix = s3
        name = ds.index.shards.name(shard)
        raw = bytearray(Path(local, name).read_bytes())
        raw[at] ^= mask
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=bytes(raw))
        damage.append(S3Undo(client, bucket, f"{prefix}/{name}", os.path.join(local, name)))
    return damage, 1 if s3 is not None else 0


class S3Undo:
    """Puts the clean copy of an S3 object back."""

    def __init__(self, client, bucket: str, key: str, clean: str) -> None:
        self.client, self.bucket, self.key, self.clean = client, bucket, key, clean

    def undo(self) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key, Body=Path(self.clean).read_bytes())


def parquet_damage(rng: random.Random, path: str, cache: str) -> tuple[list, int]:
    """A flip in a row group's pages; the node's decoded copy of that row group is flipped too, so
    the servers decode it again from the damaged file (as a first read would have)."""
    import pyarrow.parquet as pq

    meta = pq.read_metadata(path)
    g = rng.randrange(meta.num_row_groups)
    cols = [meta.row_group(g).column(j) for j in range(meta.row_group(g).num_columns)]
    lo = min(c.data_page_offset for c in cols)
    hi = max(c.data_page_offset + c.total_compressed_size for c in cols)
    damage = [Damage(path, rng.randrange(lo, hi), 1 << rng.randrange(8))]
    # an image byte of its last row: the decoded columns a worker already holds are never read again
    damage += [Damage(os.path.join(d, f), os.path.getsize(os.path.join(d, f)) - 1, 0x40)
               for d, _, fs in os.walk(cache) for f in fs if f == f"rg-{g:08d}.blk"]
    return damage, 1


# -- labels: in a part's manifest before ``hetero prepare --merge``, and in index.bin under running servers
def prepared_parts(photo_root: str, dest: str) -> str:
    """``hetero prepare``'s shards of ``photo_root`` written as two parts, not merged: the shards and
    their manifests (``_prepare/shard-*.tar.json``), as ``--merge`` finds them."""
    from data_service.prepare.writer import prepare

    if not os.path.exists(os.path.join(dest, "_prepare", "plan.json")):
        for part in ("0/2", "1/2"):
            prepare(photo_root, dest, shard_size=1 << 20, workers=1, progress=False, part=part)
    return dest


def _other_label(rng: random.Random, label: int, classes: int) -> int:
    """Another class (the damage no range check sees), or one bit of the label flipped (any value)."""
    if rng.random() < 0.5 and classes > 1:
        return (label + rng.randrange(1, classes)) % classes
    return _i4(label ^ (1 << rng.randrange(32)))


def _i4(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x


def label_manifest_damage(rng: random.Random, folder: str, classes: int, resealed: bool) -> tuple[list, int]:
    """One label changed in one part manifest of ``folder`` (a copy, not undone); with ``resealed`` the
    manifest's own checksum made to match (damage it cannot see: the per-sample checksum must)."""
    from data_service.prepare.plan import SEAL, seal

    work = os.path.join(folder, "_prepare")
    path = os.path.join(work, rng.choice(sorted(f for f in os.listdir(work) if f.endswith(".tar.json"))))
    with open(path, "rb") as f:
        doc = json.load(f)
    j = rng.randrange(len(doc["labels"]))
    doc["labels"][j] = _other_label(rng, int(doc["labels"][j]), classes)
    raw = seal({k: v for k, v in doc.items() if k != SEAL}) if resealed else json.dumps(doc).encode()
    with open(path, "wb") as f:
        f.write(raw)
    return [], 1


def label_index_damage(rng: random.Random, folder: str) -> tuple[list, int]:
    """One sample's label changed in place in ``folder``'s index.bin, its size, time and inode kept (rot
    on the disk under servers that opened the index and read every sample once)."""
    from data_service.shards.indexfile import PREFIX, read_index

    index = read_index(folder)
    path = os.path.join(folder, "index.bin")
    with open(path, "rb") as f:
        length = PREFIX.unpack(f.read(PREFIX.size))[2]
        col = json.loads(f.read(length))["columns"]["labels"]
    i = rng.randrange(len(index))
    old = int(index.labels[i])
    new = _other_label(rng, old, len(index.classes))
    at = -(-(PREFIX.size + length) // 64) * 64 + int(col["at"]) + 4 * i
    st = os.stat(path)
    damage = [Damage(path, at + k, b ^ c) for k, (b, c) in
              enumerate(zip(old.to_bytes(4, "little", signed=True), new.to_bytes(4, "little", signed=True))) if b != c]
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return damage, 1


def plain_parquet(files: list[tuple[str, int]], dest: str, row_group: int = 16) -> str:
    """One Parquet file of ``files`` as pyarrow writes it by default (snappy, dictionary pages, no page
    CRCs), with the row checksums ``hetero index`` writes beside it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_service.shards.parquet_sums import index_parquet

    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, "train-00000.parquet")
    table = pa.table({"image": pa.array([Path(p).read_bytes() for p, _ in files], pa.binary()),
                      "label": pa.array([y for _, y in files], pa.int64())})
    pq.write_table(table, path, row_group_size=row_group)
    index_parquet(path, overwrite=True)
    return path


class Zeroed:
    """``length`` bytes of ``path`` from ``at`` zeroed in place (a bad page of memory), undone by
    :meth:`undo` where the file is still the one damaged."""

    def __init__(self, path: str, at: int, length: int) -> None:
        self.path, self.at, self.inode = path, at, os.stat(path).st_ino
        with open(path, "r+b") as f:
            f.seek(at)
            self.tail = f.read(length)
            f.seek(at)
            f.write(bytes(len(self.tail)))

    def undo(self) -> None:
        try:
            if os.stat(self.path).st_ino != self.inode:
                return
        except FileNotFoundError:
            return
        with open(self.path, "r+b") as f:
            f.seek(self.at)
            f.write(self.tail)


def decoded_damage(rng: random.Random, folder: str) -> tuple[list, int]:
    """One entry of the decoded-image cache under ``folder`` damaged between epochs: 4 KiB zeroed from
    a random offset (1 in 2), else one bit flipped anywhere (its header included); no sample is lost."""
    entries = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs
                     if not f.startswith(".") and "." not in f)
    path = rng.choice(entries)
    size = os.path.getsize(path)
    if rng.random() < 0.5:
        return [Zeroed(path, rng.randrange(size), 4096)], 0
    return [Damage(path, rng.randrange(size), 1 << rng.randrange(8))], 0


def plain_parquet_damage(rng: random.Random, path: str, cache: str) -> tuple[list, int]:
    """A flip in a row group's pages (dictionary page included) of a file without page CRCs; the node's
    decoded copy of that row group is flipped too, so the servers decode it again from the damaged
    file. The samples it damages: the rows that decode otherwise, or all of the row group's when it
    no longer decodes."""
    import pyarrow.parquet as pq

    meta = pq.read_metadata(path)
    g = rng.randrange(meta.num_row_groups)
    cols = [meta.row_group(g).column(j) for j in range(meta.row_group(g).num_columns)]
    starts = [c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset
              for c in cols]
    lo, hi = min(starts), max(s + c.total_compressed_size for s, c in zip(starts, cols))
    clean = pq.ParquetFile(path).read_row_group(g).to_pylist()
    damage = [Damage(path, rng.randrange(lo, hi), 1 << rng.randrange(8))]
    try:
        hit = sum(a != b for a, b in zip(clean, pq.ParquetFile(path).read_row_group(g).to_pylist()))
    except Exception:  # pyarrow's errors for pages that no longer decode: the whole row group
        hit = len(clean)
    damage += [Damage(os.path.join(d, f), os.path.getsize(os.path.join(d, f)) - 1, 0x40)
               for d, _, fs in os.walk(cache) for f in fs if f == f"rg-{g:08d}.blk"]
    return damage, hit
