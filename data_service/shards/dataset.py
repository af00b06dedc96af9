"""``ShardDataset``: a map-style dataset over tar shards, local or in S3.

The shards are ``hetero prepare``'s, or WebDataset tars written elsewhere and indexed in place by
``hetero index`` (their index may live apart from them: ``index=``).

Sample ``i`` is ``(bytes, label)``: the file's bytes as they were written, and its class index. Any
pipeline can decode them (the image pipeline's ``shards`` option does).

Reads follow the shuffle blocks of ``data_service.contract.sampler``: a block is ``block_samples``
consecutive samples, so its bytes are one stretch of each shard it touches. From a local folder
(a File or FastFile channel, a disk) samples are read in place. From S3 the first sample of a
block a node needs brings the whole block into the node's cache (``cache.BlockCache``) with a few
large ranged GETs in parallel, never one request per sample; every worker process of the node
then reads it from there, and a later epoch reads nothing from S3 while the cache holds the data
set. Every sample's bytes are checked against the CRC32C its index holds (:mod:`.checksum`): a
mismatch drops the cached block (or reads the local shard again) and reads once more; bytes still
wrong are a :class:`~.checksum.CorruptSampleError` naming the shard, sample, byte range and both
checksums. A shard cut short after it was indexed is one for each sample past its new end; the
samples before the cut read as ever (from S3, a block that meets the cut is read sample by
sample instead of cached). A sample whose index entry is corrupt is a
:class:`~.entries.CorruptEntryError`; its shard's other samples read. A ``ShardDataset`` is a
:class:`~data_service.contract.pipeline.BlockPrefetcher`: a pipeline's
``server_side`` hands one to the data server, whose main process calls :meth:`ShardDataset.prefetch_block`
once per block a consumer hints at or asks for, so blocks arrive before the workers reach them.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os

from ..contract.pipeline import count_reread
from ..errors import ConfigError
from ..storage import LocalStore, open_store
from ..storage.base import StoreError
from . import entries
from .cache import BlockCache, CacheReader, check_reads, default_dir
from .checksum import (CorruptSampleError, check_labels, crc32c, label_of, note_labels_unchecked, note_unchecked,
                       sample_crc)
from .format import FIX, INDEX_NAME, Coverage
from .indexfile import read_index

log = logging.getLogger(__name__)

CUT = frozenset({"InvalidRange", "416"})  # a store's codes for a read past an object's end


class ShardDataset:
    """Map-style: sample ``i`` is ``(bytes, int label)``.

    Args:
        location: a folder of shards or ``s3://bucket/prefix`` (``hetero prepare``'s DEST).
        block_samples: samples per shuffle block: pass the pipeline's ``shuffle_block`` (rounded to
            whole batches), so a batch's samples lie in one block.
        cache_dir: the node-local cache for S3 data (default ``HETERO_CACHE_DIR`` or the temp folder).
        cache_bytes: the cache's bound (0: 80 % of its disk's free space).
        range_bytes: the most one GET asks for; a block is read in ranges of this size, in parallel.
        readers: parallel GETs per process.
        request_timeout_s: deadline of one S3 request (retries come on top, bounded).
        index: where the index lives when it is not beside the shards (a folder or ``s3://`` prefix
            holding ``index.bin``, e.g. ``hetero index SRC --to DEST``'s DEST for a read-only SRC);
            "" = ``location``.

    Raises:
        ConfigError: no index, a malformed one, shards missing or of the wrong size, an S3 bucket
            or key that cannot be read (naming it and the fix): at start, never mid-epoch.
    """

    def __init__(self, location: str, *, block_samples: int = 1024, cache_dir: str = "", cache_bytes: int = 0,
                 range_bytes: int = 16 << 20, readers: int = 8, request_timeout_s: float = 60.0,
                 index: str = "") -> None:
        check_reads(block_samples, range_bytes, readers)
        self.location, self.block_samples, self.range_bytes, self.readers = location, block_samples, range_bytes, readers
        self.store = open_store(location, what="shards", request_timeout_s=request_timeout_s)
        self.index = read_index(index or self.store, cache_dir=cache_dir, request_timeout_s=request_timeout_s)
        self._index_folder = index or location  # named in the command that adds checksums to an older index
        check_labels(self.index, open_store(index, what="index", request_timeout_s=request_timeout_s) if index
                     else self.store, cache_dir or default_dir())
        self.local = isinstance(self.store, LocalStore)
        digest = hashlib.sha256(location.encode() + b"\0" + self.index.id.encode()).hexdigest()[:16]
        checked = "" if self.local else os.path.join(cache_dir or default_dir(), f"shards-{digest}.checked")
        if not checked or not os.path.exists(checked):  # from S3: once per node and index
            self._check_shards()
            if checked:
                with contextlib.suppress(OSError):
                    open(checked, "a").close()
        self.classes = self.index.classes
        self.cache: BlockCache | None = None
        self._reads: CacheReader | None = None  # a folder's samples are read in place, S3's through the cache
        self._cut: set[int] = set()  # blocks a shard cut short keeps out of the cache: read sample by sample
        if not self.local:
            self.cache = BlockCache(os.path.join(cache_dir or default_dir(), f"shards-{digest}"), cache_bytes)
            self._reads = CacheReader(self.cache, self._name, self.store, readers, range_bytes, "shard block")
            largest = self._largest_block()
            if largest > self.cache.max_bytes:
                raise ConfigError(f"a shuffle block of {block_samples} samples takes up to {largest} bytes, more than "
                                  f"cache_bytes={self.cache.max_bytes} ({self.cache.dir}); raise cache_bytes, free "
                                  "disk space there (or point cache_dir elsewhere), or lower shuffle_block")

    def _check_shards(self) -> None:
        """Every shard is there with the size the index gives: one LIST per folder of shards."""
        table = self.index.shards
        listed: dict[str, dict[str, int]] = {}
        missing, wrong = [], []
        for k in range(len(table)):
            name = table.name(k)
            folder, _, base = name.rpartition("/")
            if folder not in listed:
                listed[folder] = dict(self.store.list(under=folder))
            size = listed[folder].get(base)
            if size is None:
                missing.append(name)
            elif size != int(table.sizes[k]):
                wrong.append(f"{name} ({size} bytes, index says {int(table.sizes[k])})")
        if missing or wrong:
            what = (f"{len(missing)} shard(s) missing ({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''})"
                    if missing else f"shard(s) of the wrong size: {', '.join(wrong[:3])}")
            raise ConfigError(f"{self.store.url}: {what}; the prefix is incomplete or was overwritten: write it "
                              "again with `hetero prepare` (tars written elsewhere: index them again with "
                              "`hetero index`)")

    def _largest_block(self) -> int:
        """Bytes of the largest shuffle block, or a bound on them (from the index's largest sample stride)."""
        blocks = -(-len(self.index) // self.block_samples)
        if self.index.max_stride and self.block_samples * self.index.max_stride <= self._node.cache.max_bytes:
            return self.block_samples * self.index.max_stride
        return max(sum(stop - start for _, start, stop in self.block_parts(b)) for b in range(blocks))

    def __len__(self) -> int:
        return len(self.index)

    @property
    def _node(self) -> CacheReader:
        """The reads through the node's cache of blocks; a folder's samples are read in place and have none."""
        if self._reads is None:
            raise RuntimeError(f"{self.store.url}: a folder's samples are read in place, not through a block cache")
        return self._reads

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        if not 0 <= i < len(self.index):
            raise IndexError(f"sample {i} is outside 0..{len(self.index) - 1}")
        shard, start, length, label = self.index.sample(i)
        expected = self.index.checksum(i)
        where = self.index.shards.where or self.location
        if expected is None:
            note_unchecked(where, where.endswith(INDEX_NAME), self._index_folder)
            return self._read(i, shard, start, length), label
        covered = self.index.coverage is Coverage.BYTES_LABEL
        if not covered:
            note_labels_unchecked(where, self._index_folder)
        data = self._read(i, shard, start, length)
        raw = crc32c(data)
        got = sample_crc(raw, label) if covered else raw
        if got != expected and entries.overlap(self.index, i):
            raise self._mismatch(i, shard, start, length, got, expected)  # the entry is wrong: no copy to blame
        if got != expected:
            if covered:
                self._check_label(i, shard, label, raw, expected)
            # a bad copy (a cache block written while a disk failed, a page flipped) is dropped and the
            # source read once more; only bytes wrong at the source are reported
            count_reread()
            log.warning("sample %d of shard %s: checksum %08x, the index says %08x; %s", i,
                        self.index.shards.name(shard), got, expected,
                        "reading the shard again" if self.local else "dropping the cached block, reading S3 again")
            if not self.local:
                self._node.drop(i // self.block_samples)
            data = self._read(i, shard, start, length)
            got = crc32c(data)
            if covered:
                got = sample_crc(got, label)
            if got != expected:
                raise self._mismatch(i, shard, start, length, got, expected)
        return data, label

    def _check_label(self, i: int, shard: int, label: int, data_crc: int, expected: int) -> None:
        """CorruptSampleError when the bytes read are good and the label is what changed: the one label
        the bytes and the checksum agree on is another class (damaged bytes give a label at random,
        among the classes with a chance of classes / 2**32)."""
        meant = label_of(data_crc, expected)
        if meant != label and 0 <= meant < (len(self.index.classes) or 1 << 31):
            raise CorruptSampleError(
                f"sample {i} of shard {self.store.key_url(self.index.shards.name(shard))} has label {label} in "
                f"{self.index.shards.where or 'its index'}, but its checksum {expected:08x} matches its bytes with "
                f"label {meant}: the index's labels column was damaged after it was written; {FIX} (or pass "
                "pipeline.on_corrupt=skip to drop such samples, counted in samples_skipped)")

    def _mismatch(self, i: int, shard: int, start: int, length: int, got: int, expected: int) -> CorruptSampleError:
        url = self.store.key_url(self.index.shards.name(shard))
        said = (f"sample {i} of shard {url} (bytes {start}..{start + length}) has CRC32C {got:08x}, the index says "
                f"{expected:08x}, read twice from the source")
        overlap = entries.overlap(self.index, i)
        if overlap:  # the entry, not the shard, is what is wrong
            return CorruptSampleError(f"{said}: {overlap}; the index is corrupt: {FIX}, or pass "
                                      "pipeline.on_corrupt=skip to drop such samples (counted in samples_skipped)")
        return CorruptSampleError(
            f"{said}: the shard was damaged or overwritten after it was indexed; copy it again (or write the "
            "prefix again with `hetero prepare` / `hetero index`), or pass pipeline.on_corrupt=skip to drop such "
            "samples (counted in samples_skipped)")

    def where(self, i: int) -> str:
        """The shard holding sample ``i``, as a path or ``s3://`` URL (for messages)."""
        return self.store.key_url(self.index.shards.name(self.index.shard_at(i)))

    def _read(self, i: int, shard: int, start: int, length: int) -> bytes:
        """Sample ``i``'s bytes: from the shard in place, or from its block in the node's cache.

        Raises:
            CorruptSampleError: the shard ends before the sample does (it was cut short).
        """
        name = self.index.shards.name(shard)
        try:
            if self.local or i // self.block_samples in self._cut:
                return self.store.read(name, start, start + length)
            return self._cached(i, shard, start, length)
        except StoreError as exc:
            if exc.code not in CUT:
                raise
            raise self._cut_short(i, shard, start, length) from None

    def _cut_short(self, i: int, shard: int, start: int, length: int) -> CorruptSampleError:
        name = self.index.shards.name(shard)
        try:
            now = f"it holds {self.store.size(name)} bytes now"
        except StoreError:
            now = "it is shorter now"
        return CorruptSampleError(
            f"sample {i} of shard {self.store.key_url(name)} (bytes {start}..{start + length}) lies past the "
            f"shard's end: {now}, the index says {int(self.index.shards.sizes[shard])}; the shard was cut short "
            "after it was indexed (the samples before the cut still read): copy it again (or write the prefix "
            "again with `hetero prepare` / `hetero index`), or pass pipeline.on_corrupt=skip to drop such samples "
            "(counted in samples_skipped)")

    def _cached(self, i: int, shard: int, start: int, length: int) -> bytes:
        """Sample ``i``'s bytes from its block in the node's cache; a block whose fetch met the end of a
        shard cut short is not cached, and its samples are read from the store one by one (the ones
        before the cut whole)."""
        block = i // self.block_samples
        try:
            fd, where = self._node.entry(block, self._open_block)
        except StoreError as exc:
            if exc.code not in CUT:
                raise
            self._cut.add(block)
            log.warning("shard block %d cannot be cached (%s); reading its samples one by one", block, exc)
            return self.store.read(self.index.shards.name(shard), start, start + length)
        part_start, part_stop, pos = where[shard]
        if start < part_start or start + length > part_stop:
            # an entry out of byte order with its neighbours (an index with checksums leaves it to the
            # checksum, see .entries): its bytes are not in the block, and are read for the check alone
            return self.store.read(self.index.shards.name(shard), start, start + length)
        data = os.pread(fd, length, pos + start - part_start)
        if len(data) != length:
            raise OSError(f"cached block of sample {i} is short ({len(data)} of {length} bytes)")
        return data

    # -- blocks
    def block_parts(self, block: int) -> list[tuple[int, int, int]]:
        """``(shard, start, stop)`` byte ranges of block ``block``, in the order they are cached."""
        first = block * self.block_samples
        return self.index.parts(first, min(first + self.block_samples, len(self.index)))

    def _name(self, block: int) -> str:
        return f"b{self.block_samples}-{block:07d}.blk"

    def _open_block(self, block: int) -> tuple[int, dict[int, tuple[int, int, int]]]:
        """An open descriptor of the block, fetched into the node's cache if absent, and per shard (its range's
        start and stop, its place in the block)."""
        where, named, pos = {}, [], 0
        for shard, start, stop in self.block_parts(block):
            where[shard] = (start, stop, pos)
            named.append((self.index.shards.name(shard), start, stop))
            pos += stop - start
        return self._node.cache.open(self._name(block), pos, lambda out: self._node.fill(out, named)), where

    def prefetch_block(self, block: int) -> None:
        """Start fetching block ``block`` into the node's cache; returns at once (a
        :class:`~data_service.contract.pipeline.BlockPrefetcher`). A folder's samples are read in place:
        nothing to fetch; a block already cached or being fetched is skipped."""
        if not self.local and block not in self._cut:
            self._node.prefetch([block], self._prefetch_one)

    def _prefetch_one(self, block: int) -> None:
        try:
            os.close(self._open_block(block)[0])
        except StoreError as exc:
            if exc.code not in CUT:
                raise
            self._cut.add(block)  # a shard cut short: the workers read the block's samples one by one
            log.warning("shard block %d cannot be cached (%s); not prefetching it again", block, exc)
