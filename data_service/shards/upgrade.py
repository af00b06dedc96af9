"""``hetero index --upgrade``: an earlier release's ``index.bin`` rewritten as this release's.

Version 3 checksums cover a sample's bytes alone and version 2 has none; version 4's cover the
bytes and then the label (:mod:`.checksum`). The old index is checked whole first, so a label
already damaged is refused rather than sealed into a checksum.
"""
from __future__ import annotations

import os
import tempfile

from ..errors import ConfigError
from ..storage import LocalStore, open_store
from .checksum import RANGE
from .format import INDEX_NAME, ShardIndex
from .indexfile import verify, write_index


def upgrade_index(src, dest: str = "", *, overwrite: bool = False) -> ShardIndex:
    """Rewrite the index.bin of an earlier release at ``src`` (checksums over the samples' bytes alone,
    or none) as this release's, each sample's checksum covering its bytes and then its label, to
    ``dest`` (default: in place). ``hetero index --upgrade``.

    The old index is checked whole first (every column against its CRC-32, every entry), so a label
    already damaged is refused, never sealed into a checksum; the shards are read only when the old
    index holds no checksums. Returns the index written.

    Raises:
        ConfigError: no index.bin at ``src``, one that is damaged (naming the column and the fix),
            or an index at ``dest`` (other than ``src``) without ``overwrite``.
    """
    store = open_store(src, what="source") if isinstance(src, str) else src
    out = open_store(dest, what="dest", create=True) if dest else store
    if not store.exists(INDEX_NAME):
        raise ConfigError(f"{store.url.rstrip('/')} holds no {INDEX_NAME} to upgrade (an index.json: `hetero index "
                          f"--from-json {src}`; tars without an index: `hetero index {src}`)")
    if dest and out.exists(INDEX_NAME) and not overwrite:
        raise ConfigError(f"{out.url} already holds {INDEX_NAME}; pass --overwrite to replace it")
    where = f"{store.url.rstrip('/')}/{INDEX_NAME}"
    with tempfile.TemporaryDirectory(prefix="index-upgrade-") as tmp:
        path = store.key_url(INDEX_NAME) if isinstance(store, LocalStore) else os.path.join(tmp, INDEX_NAME)
        if not isinstance(store, LocalStore):
            size = store.check(INDEX_NAME)
            with open(path, "wb") as f:
                for a in range(0, size, RANGE):
                    f.write(store.read(INDEX_NAME, a, min(size, a + RANGE)))
        index = verify(path, where)
        write_index(out, index, shards=store)
    return index
