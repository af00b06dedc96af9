"""How ``hetero prepare`` splits a data set into shards, parts and resumable steps, and the merge.

The source's samples, in their shuffled order, are cut into shards of ``per_shard`` samples each
(chosen once from the source so that a shard is about ``shard_size`` bytes): shard ``k`` holds
samples ``k * per_shard`` onwards, whichever machine writes it. ``--part i/N`` writes shards
``i * S // N`` up to ``(i + 1) * S // N`` of the ``S``, so parts are disjoint and together whole.

DEST holds, while a run is under way, ``_prepare/plan.json`` (the split and the options that
shape the bytes: every part checks it has the same) and one manifest per finished shard
(``_prepare/shard-000123.tar.json``: where each sample lies in it, its label and checksum, the
files skipped; a CRC32C of its own), written atomically after the shard itself. A run that stops (a crash, a lost machine) and starts again
keeps the shards that have a manifest and writes the rest. :func:`merge` joins the manifests into
``index.bin`` once every shard has one, checking each manifest's own checksum (a label changed
in a manifest would otherwise be written into the index with it), then removes them: a prefix
with an index is complete.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from data_service.errors import ConfigError
from data_service.shards.checksum import crc32c
from data_service.shards.format import INDEX_NAME, JSON_INDEX_NAME, SHARD_PATTERN
from data_service.shards.indexfile import IndexWriter
from data_service.storage import LocalStore
from data_service.storage.base import StoreError

WORK = "_prepare"
PLAN = f"{WORK}/plan.json"
MERGE_READERS = 16
SEAL = "crc32c_manifest"  # a manifest's own checksum
TAR_OVERHEAD = 2 * 512 + 512 + 256  # per sample: two member headers, a .cls block, padding on average


@dataclass
class Summary:
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    data_bytes: int = 0
    reencoded: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    part: str = ""  # "i/N" when only a part was written
    kept: int = 0  # shards a resumed run found finished

    def lines(self, dest: str) -> list[str]:
        what = f"part {self.part}: " if self.part else ""
        out = [f"{what}wrote {self.samples} samples in {self.shards} shard(s), {self.bytes / 1e6:.1f} MB "
               f"({self.data_bytes / 1e6:.1f} MB of sample data) to {dest} in {self.seconds:.1f}s"]
        if self.kept:
            out.append(f"kept {self.kept} shard(s) an earlier run finished")
        if self.reencoded:
            out.append(f"re-encoded {self.reencoded} image(s) larger than max_side")
        if self.skipped:
            out.append(f"skipped {len(self.skipped)} file(s) that do not decode:")
            out += [f"  {name}: {why}" for name, why in self.skipped[:50]]
            if len(self.skipped) > 50:
                out.append(f"  ... and {len(self.skipped) - 50} more")
        return out


@dataclass(frozen=True)
class Split:
    """The split every part of one run shares (written to ``_prepare/plan.json``)."""

    samples: int
    per_shard: int
    seed: int | None
    max_side: int
    verify: bool
    classes: tuple[str, ...]
    source: str  # a digest of the source's items (relative paths and labels, or the import path and length)

    @property
    def shards(self) -> int:
        return -(-self.samples // self.per_shard)

    def part_shards(self, part: tuple[int, int] | None) -> range:
        """The shards part ``(i, N)`` writes (None: all of them)."""
        if part is None:
            return range(self.shards)
        i, n = part
        return range(i * self.shards // n, (i + 1) * self.shards // n)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> "Split":
        try:
            doc = json.loads(raw)
            return cls(int(doc["samples"]), int(doc["per_shard"]), doc["seed"], int(doc["max_side"]),
                       bool(doc["verify"]), tuple(str(c) for c in doc["classes"]), str(doc["source"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{where} is not a prepare plan ({exc}); remove {WORK}/ there and start again, or "
                              "pass --overwrite") from None


def parse_part(text: str) -> tuple[int, int]:
    """``"i/N"`` as ``(i, N)``; ConfigError naming the value when it is not ``0 <= i < N``."""
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ConfigError(f"--part {text!r} must be i/N, e.g. 0/4 for the first of 4 machines") from None
    if not 0 <= i < n:
        raise ConfigError(f"--part {text!r} must be i/N with 0 <= i < N (e.g. 0/4 .. 3/4)")
    return i, n


def per_shard(shard_size: int, sample_bytes: list[int]) -> int:
    """Samples per shard for shards of about ``shard_size`` bytes, from a sample of the source's sizes."""
    mean = (sum(sample_bytes) / len(sample_bytes)) if sample_bytes else 100_000
    return max(1, int(shard_size // (mean + TAR_OVERHEAD)))


def items_digest(items: list[tuple[str, int]], root: str) -> str:
    """A digest of the source's items: the same folder (or data set) on every machine gives the same."""
    h = hashlib.sha256()
    for path, label in items:
        h.update(f"{os.path.relpath(path, root) if root else path}\0{label}\n".encode())
    return h.hexdigest()[:24]


def manifest_key(k: int) -> str:
    return f"{WORK}/{SHARD_PATTERN.format(k)}.json"


def manifest(name: str, size: int, offsets, lengths, labels, skipped, reencoded: int, checksums) -> bytes:
    """A finished shard's manifest: ``checksums`` are each sample's CRC32C over its bytes and label
    (:func:`data_service.shards.checksum.sample_crc`); the whole carries a checksum of its own (:func:`seal`)."""
    return seal({"name": name, "size": size, "offsets": [int(x) for x in offsets],
                 "lengths": [int(x) for x in lengths], "labels": [int(x) for x in labels],
                 "sample_crc32c": [int(x) for x in checksums],
                 "skipped": [list(s) for s in skipped], "reencoded": reencoded})


def seal(doc: dict) -> bytes:
    """``doc`` as JSON with ``crc32c_manifest``: the CRC32C of ``doc``'s JSON without it."""
    body = json.dumps(doc, separators=(",", ":"))
    return (body[:-1] + f',"{SEAL}":{crc32c(body.encode())}}}').encode()


def unsealed(raw: bytes, where: str) -> dict:
    """The manifest ``raw`` (read from ``where``) as a dict, once its own checksum matches.

    Raises:
        ConfigError: not JSON, no checksum of its own (an earlier release's), or one that does not
            match (a value changed after the part wrote it), naming ``where`` and the fix.
    """
    fix = "delete it and run that part again (it writes that shard again)"
    try:
        doc = json.loads(raw)
        want = doc.pop(SEAL) if isinstance(doc, dict) and SEAL in doc else None
    except ValueError as exc:
        raise ConfigError(f"{where} is malformed ({exc}); {fix}") from None
    if want is None:
        raise ConfigError(f"{where} has no checksum of its own (written by an earlier release, or not a manifest); "
                          f"{fix}")
    got = crc32c(json.dumps(doc, separators=(",", ":")).encode())
    if got != want:
        raise ConfigError(f"{where} fails its checksum (CRC32C {got:08x}, it says {int(want):08x}): it changed after "
                          f"its part wrote it, and a changed label or offset would train silently; {fix}")
    return doc


def finished(store) -> set[int]:
    """The shards whose manifest is in ``store`` (one LIST of ``_prepare/``)."""
    done = set()
    for key, _ in store.list(".json", under=WORK):
        if key.startswith("shard-") and key.endswith(".tar.json"):
            with contextlib.suppress(ValueError):
                done.add(int(key[len("shard-"):-len(".tar.json")]))
    return done


def read_plan(store) -> Split | None:
    try:
        return Split.from_json(store.read(PLAN), store.key_url(PLAN)) if store.exists(PLAN) else None
    except StoreError as exc:
        raise ConfigError(str(exc)) from exc


def _manifests(store, shards: int, pool: ThreadPoolExecutor):
    """``(k, manifest bytes)`` in shard order, read ``MERGE_READERS`` at a time (an S3 prefix: a GET
    each), a bounded window ahead so memory stays flat."""
    for start in range(0, shards, 4 * MERGE_READERS):
        ks = range(start, min(shards, start + 4 * MERGE_READERS))
        yield from zip(ks, pool.map(lambda k: store.read(manifest_key(k)), ks))


def merge(store) -> Summary:
    """Join the shard manifests of the run in ``store`` into ``index.bin``; remove the manifests and
    shards of earlier runs. ConfigError naming the missing shards (and their parts) when some are not done."""
    plan = read_plan(store)
    if plan is None:
        raise ConfigError(f"{store.url} holds no prepare run ({PLAN} is missing): run `hetero prepare SRC DEST "
                          "[--part i/N]` first")
    done = finished(store)
    missing = [k for k in range(plan.shards) if k not in done]
    if missing:
        raise ConfigError(f"{store.url}: {len(missing)} of {plan.shards} shard(s) are not written yet "
                          f"(first: {SHARD_PATTERN.format(missing[0])}); finish every part (a part started again "
                          "keeps what it finished), then merge")
    summary = Summary()
    with IndexWriter(store.root if isinstance(store, LocalStore) else "") as writer, \
            ThreadPoolExecutor(MERGE_READERS) as pool:
        for k, raw in _manifests(store, plan.shards, pool):
            doc = unsealed(raw, store.key_url(manifest_key(k)))
            try:
                writer.add_shard(doc["name"], int(doc["size"]), np.array(doc["offsets"], dtype=np.int64),
                                 doc["lengths"], doc["labels"], doc["sample_crc32c"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{store.key_url(manifest_key(k))} is malformed ({exc}); delete it and run that "
                                  "part again") from None
            summary.skipped += [(str(a), str(b)) for a, b in doc["skipped"]]
            summary.reencoded += int(doc["reencoded"])
            summary.bytes += int(doc["size"])
        if not len(writer):
            raise ConfigError(f"none of the {plan.samples} files of the source decodes; nothing written to "
                              f"{store.url}")
        writer.store(store, list(plan.classes))
        summary.samples, summary.shards, summary.data_bytes = len(writer), plan.shards, writer.data_bytes
    keep = {SHARD_PATTERN.format(k) for k in range(plan.shards)} | {INDEX_NAME}
    stale = [name for name, _ in store.list() if not name.startswith(WORK + "/") and name not in keep
             and (name.endswith(".tar") or name == JSON_INDEX_NAME)]
    work = [manifest_key(k) for k in range(plan.shards)] + [PLAN]
    with ThreadPoolExecutor(16) as pool:  # an S3 prefix: one request each
        list(pool.map(store.delete, stale + work))
    if isinstance(store, LocalStore):
        with contextlib.suppress(OSError):
            os.rmdir(store.key_url(WORK))
    return summary
