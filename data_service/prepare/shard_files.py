"""The tar files ``hetero prepare`` writes: converted samples filed into their shard, each finished
shard stored (a folder renames it into place, S3 uploads it) and then its manifest, so a run that
stops keeps, and knows, every shard it finished (``data_service.prepare.plan``).
"""
from __future__ import annotations

import contextlib
import io
import os
import tarfile
import threading
import time
from typing import Callable, Generator

from ..shards.checksum import crc32c, sample_crc
from ..shards.format import SHARD_PATTERN, padded
from .plan import Summary, manifest, manifest_key


class ShardTar:
    """One tar file being written (shard ``k``); records where each sample's data lies in it."""

    def __init__(self, folder: str, k: int) -> None:
        self.k, self.name = k, SHARD_PATTERN.format(k)
        self.path = os.path.join(folder, self.name)
        self.tar = tarfile.open(self.path, "w", format=tarfile.USTAR_FORMAT)
        self.offsets: list[int] = []
        self.lengths: list[int] = []
        self.labels: list[int] = []
        self.checksums: list[int] = []
        self.skipped: list[tuple[str, str]] = []
        self.reencoded = 0

    def add(self, key: str, ext: str, data: bytes, label: int) -> None:
        """Add one sample: its data as ``key.ext`` and its label as ``key.cls``."""
        self._member(f"{key}.{ext}", data)
        self.offsets.append(self.tar.offset - padded(len(data)))
        self.lengths.append(len(data))
        self.labels.append(label)
        self.checksums.append(sample_crc(crc32c(data), label))  # the label it files in ``key.cls``, too
        self._member(f"{key}.cls", str(label).encode())

    def _member(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o444, "", ""
        self.tar.addfile(info, io.BytesIO(data))

    def close(self) -> bytes:
        """Close the tar; the shard's manifest (``data_service.prepare.plan.manifest``)."""
        self.tar.close()
        return manifest(self.name, os.path.getsize(self.path), self.offsets, self.lengths, self.labels,
                        self.skipped, self.reencoded, self.checksums)


class Uploads:
    """Stores each finished shard under its name (a folder renames it into place, S3 uploads it)
    and then its manifest, at most four at once so local staging stays bounded."""

    def __init__(self, store) -> None:
        self.store = store
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def add(self, path: str, name: str, after: tuple[str, bytes]) -> None:
        """Store ``path`` as ``name``, then write ``after`` (key, bytes): the shard's manifest comes second."""
        def upload():
            try:
                self.store.write_file(name, path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self.store.write_bytes(*after)
            except BaseException as exc:  # reported after the last shard
                self.errors.append(exc)
        while len([t for t in self.threads if t.is_alive()]) >= 4:
            time.sleep(0.05)
        t = threading.Thread(target=upload, name=f"upload {name}", daemon=True)
        t.start()
        self.threads.append(t)

    def add_shard(self, shard: ShardTar) -> None:
        """Close ``shard`` and store it, its manifest after it."""
        self.add(shard.path, shard.name, (manifest_key(shard.k), shard.close()))

    def join(self) -> None:
        """Wait for every upload; raise the first one's error."""
        for t in self.threads:
            t.join()
        if self.errors:
            raise self.errors[0]


def write_shards(store, per_shard: int, results: Generator[tuple, None, None], summary: Summary,
                 name_of: Callable[[int], str]) -> None:
    """File converted samples into their shards in ``store`` and count them in ``summary``.

    Args:
        per_shard: samples per shard; sample ``pos`` goes to shard ``pos // per_shard``.
        results: ``(position, extension, bytes, label, why skipped, re-encoded)`` per sample, in
            position order (a generator, closed here).
        name_of: how a skipped sample at a position is named in its shard's list of skipped files.
    """
    with store.staging() as staging:
        uploads = Uploads(store)
        shard: ShardTar | None = None
        try:
            with contextlib.closing(results):
                for pos, ext, data, label, why, reencoded in results:
                    k = pos // per_shard
                    if shard is None or shard.k != k:
                        if shard is not None:
                            uploads.add_shard(shard)
                        shard = ShardTar(staging, k)
                        summary.shards += 1
                    if why:
                        shard.skipped.append((name_of(pos), why))
                        continue
                    shard.add(f"{pos:09d}", ext, data, label)
                    shard.reencoded += reencoded
                    summary.samples += 1
                    summary.data_bytes += len(data)
            if shard is not None:
                uploads.add_shard(shard)
        finally:
            uploads.join()  # a run that fails keeps (and records) every shard it finished
