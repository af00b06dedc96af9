"""An index.bin as the release before labels were in the per-sample checksums wrote it (version 3)."""
from __future__ import annotations

import zlib
from pathlib import Path

from data_service.shards.checksum import sample_checksums
from data_service.shards.format import INDEX_NAME
from data_service.shards.indexfile import MAGIC, PREFIX, IndexWriter, read_index
from data_service.storage import LocalStore


def as_version_3(folder: Path) -> None:
    """Rewrite ``folder``'s index.bin as version 3: each checksum over the sample's bytes alone."""
    index = read_index(str(folder))
    path = Path(folder) / INDEX_NAME
    with IndexWriter(str(folder)) as w:
        for k in range(len(index.shards)):
            a, b = int(index.shards.first[k]), int(index.shards.first[k + 1])
            name = index.shards.name(k)
            w.add_shard(name, int(index.shards.sizes[k]), index.offsets[a:b], index.lengths[a:b], index.labels[a:b],
                        sample_checksums(LocalStore(str(folder)), name, index.offsets[a:b], index.lengths[a:b]))
        w.write_file(str(path), index.classes)
    raw = bytearray(path.read_bytes())
    length = PREFIX.unpack(raw[:PREFIX.size])[2]
    header = bytes(raw[PREFIX.size:PREFIX.size + length]).replace(b'"version":4', b'"version":3')
    raw[:PREFIX.size + length] = PREFIX.pack(MAGIC, 3, length, zlib.crc32(header)) + header
    path.write_bytes(bytes(raw))
