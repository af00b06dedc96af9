"""The shard layout: WebDataset-compatible tar files plus an index that makes any sample one ranged read.

A prefix (a local folder or ``s3://bucket/prefix``) holds::

    shard-000000.tar   <key>.jpg (or .png, the bytes as they were) + <key>.cls (the label, ASCII)
    shard-000001.tar   ...
    index.json         classes, shards, and per sample: shard, byte offset of its data, length, label

The tar files are plain ustar archives, so the ``webdataset`` library (and ``tar tf``) reads them
unchanged. Samples are numbered in the order they were written, shard after shard, so a run of
consecutive sample indices is one contiguous stretch of bytes in each shard it touches: a shuffle
block (``data_service.sampler``) is a handful of large ranged reads.

The index's per-sample columns are little-endian integer arrays in base64 (compact, and parsed
without pickle); ``hetero prepare`` writes it last, so a prefix with an index is complete.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

INDEX_NAME = "index.json"
FORMAT = "hetero-shards"
VERSION = 1
SHARD_PATTERN = "shard-{:06d}.tar"
TAR_BLOCK = 512


@dataclass(frozen=True)
class ShardInfo:
    """One tar file: its name under the prefix, size in bytes, and the samples it holds."""

    name: str
    size: int
    first: int
    count: int


def _encode(array: np.ndarray, dtype: str) -> dict:
    return {"dtype": dtype, "b64": base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode()}


def _decode(field: dict, n: int, name: str, where: str) -> np.ndarray:
    try:
        dtype = np.dtype(field["dtype"])
        if dtype.kind not in "iu":
            raise ValueError(f"dtype {dtype} is not an integer type")
        array = np.frombuffer(base64.b64decode(field["b64"], validate=True), dtype=dtype)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: column {name!r} is malformed ({exc}); write the prefix again with "
                          "`hetero prepare`") from None
    if len(array) != n:
        raise ConfigError(f"{where}: column {name!r} has {len(array)} entries for {n} samples; write the prefix "
                          "again with `hetero prepare`")
    return array.astype(np.int64)


class ShardIndex:
    """Where every sample lies: ``offsets[i]``/``lengths[i]`` in shard ``shard_of[i]``, label ``labels[i]``."""

    def __init__(self, classes: list[str], shards: list[ShardInfo], offsets: np.ndarray, lengths: np.ndarray,
                 labels: np.ndarray) -> None:
        self.classes = list(classes)
        self.shards = list(shards)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.shard_of = np.repeat(np.arange(len(shards), dtype=np.int64), [s.count for s in shards])

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def data_bytes(self) -> int:
        """Bytes of sample data (the shards less their tar headers and padding)."""
        return int(self.lengths.sum())

    def to_json(self) -> bytes:
        return json.dumps({
            "format": FORMAT, "version": VERSION, "num_samples": len(self), "classes": self.classes,
            "shards": [{"name": s.name, "size": s.size, "first": s.first, "count": s.count} for s in self.shards],
            "offsets": _encode(self.offsets, "<i8"), "lengths": _encode(self.lengths, "<u4"),
            "labels": _encode(self.labels, "<i4"),
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "ShardIndex":
        """Parse and check an index; ConfigError naming ``where`` and the fix when it is not one."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{where} is not a shard index ({exc}); write the prefix with `hetero prepare`") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ConfigError(f"{where} is not a {FORMAT} index; write the prefix with `hetero prepare`")
        if doc.get("version") != VERSION:
            raise ConfigError(f"{where} is {FORMAT} version {doc.get('version')!r}; this release reads version "
                              f"{VERSION}: write the prefix again with this release's `hetero prepare`")
        try:
            n = int(doc["num_samples"])
            shards = [ShardInfo(str(s["name"]), int(s["size"]), int(s["first"]), int(s["count"]))
                      for s in doc["shards"]]
            classes = [str(c) for c in doc.get("classes", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: malformed index ({type(exc).__name__}: {exc}); write the prefix again "
                              "with `hetero prepare`") from None
        expected = 0
        for s in shards:
            if s.first != expected or s.count < 0 or "/" in s.name or not s.name.endswith(".tar"):
                raise ConfigError(f"{where}: shard entry {s} does not follow the one before it; write the prefix "
                                  "again with `hetero prepare`")
            expected += s.count
        if expected != n:
            raise ConfigError(f"{where}: shards hold {expected} samples, the index says {n}")
        index = cls(classes, shards, _decode(doc["offsets"], n, "offsets", where),
                    _decode(doc["lengths"], n, "lengths", where), _decode(doc["labels"], n, "labels", where))
        sizes = np.array([s.size for s in shards], dtype=np.int64)
        if n and bool(np.any(index.offsets + index.lengths > sizes[index.shard_of])):
            raise ConfigError(f"{where}: a sample lies past the end of its shard; write the prefix again")
        return index

    def parts(self, first: int, end: int) -> list[tuple[int, int, int]]:
        """The byte ranges holding samples ``first..end-1``: ``(shard, start, stop)``, one per shard touched."""
        if not 0 <= first < end <= len(self):
            raise IndexError(f"samples {first}..{end - 1} are outside 0..{len(self) - 1}")
        out = []
        i = first
        while i < end:
            s = int(self.shard_of[i])
            info = self.shards[s]
            last = min(end, info.first + info.count) - 1
            out.append((s, int(self.offsets[i]), int(self.offsets[last] + self.lengths[last])))
            i = last + 1
        return out


def padded(n: int) -> int:
    """Bytes a tar member's data takes, padded to the 512-byte tar block."""
    return -(-n // TAR_BLOCK) * TAR_BLOCK
