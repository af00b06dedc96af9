"""An index for WebDataset tar shards written by any tool, so they are read in place (``hetero index``).

A sample is the members sharing a key, the WebDataset convention (adjacent there; here they need
not be, as in a ``tar cf`` without ``--sort=name``): the key is a member's path up to the first
dot of its last component (``a/b/0001.seg.jpg`` has key ``a/b/0001`` and extension ``seg.jpg``).
Samples are numbered shard after shard, in the order of their images in each. Of each sample the
index records the image member (``.jpg``, ``.jpeg``, ``.png`` or ``.webp``; the first of
``image_exts`` present) by where its data lies in the shard, a label read by a :class:`LabelRule`,
and a CRC32C over the image's bytes (computed as the walk passes them) and then the label
(:func:`.checksum.sample_crc`):

* ``cls`` (the default): a member ``<key>.cls`` holding an integer (any extension names a text member);
* ``json:FIELD``: the field ``FIELD`` (dotted for nested ones) of ``<key>.json``;
* ``txt``: the text of ``<key>.txt``.

An integer is a class index; a text is a class name, numbered in the order ``classes`` gives (or,
without it, in the order the names are first met). Each shard is read once, front to back
(:mod:`.tarwalk`); no data is written to the source: the index goes to ``dest`` (default the
source itself). The data server then reads the tars where they are, through
:class:`~.dataset.ShardDataset` (``index=`` names an index kept apart from the tars).

A sample without its label member, with one over ``MAX_LABEL_BYTES`` (1 MiB: it is never read),
or with an image of another type (``.gif``, ``.tiff``, ...), or a tar that is corrupt or
truncated, stops the indexing naming it and the fix; with ``on_corrupt="skip"`` it is left out of
the index and counted (a damaged shard keeps every whole sample before the damage; only the sample
the damage cut is left out). A tar cut at a member boundary, without its end-of-archive blocks
(an interrupted upload), keeps its whole samples and is named in the summary; ``strict=True``
refuses it.
"""
from __future__ import annotations

import collections
import os
import re
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from ..contract.on_corrupt import OnCorrupt
from ..errors import ConfigError, check_integer
from ..storage import LocalStore, open_store
from .checksum import sample_crcs
from .format import INDEX_NAME, JSON_INDEX_NAME, check_name
from .indexfile import IndexWriter
from .labels import LabelRule, UnindexableSample
from .tarwalk import ForwardReader, TarError, Unended, members


IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
OTHER_IMAGES = ("gif", "bmp", "tif", "tiff", "ppm", "pgm", "heic", "avif", "jxl", "jp2")
MAX_LABEL_BYTES = 1 << 20  # the most a label member may hold: it is read into memory
KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")
BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


@dataclass
class IndexSummary:
    """What ``index_tars`` wrote: counts, skipped samples by reason, and where the index went."""

    index: str = ""
    shards: int = 0
    samples: int = 0
    data_bytes: int = 0
    bytes_read: int = 0
    classes: list[str] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # the first skipped samples or shards, named
    unended: list[str] = field(default_factory=list)  # shards cut at a member boundary: indexed, but named

    def lines(self) -> list[str]:
        out = [f"indexed {self.samples} samples in {self.shards} shard(s) ({self.data_bytes / 1e6:.1f} MB of images, "
               f"{len(self.classes)} classes; read {self.bytes_read / 1e6:.1f} MB once): {self.index}"]
        if self.skipped:
            out.append("skipped: " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) +
                       (f" (e.g. {'; '.join(self.examples[:3])})" if self.examples else ""))
        if self.unended:
            out.append(f"{len(self.unended)} shard(s) without their end-of-archive blocks: "
                       f"{', '.join(self.unended[:5])}{' ...' if len(self.unended) > 5 else ''} (cut short, as by an "
                       "interrupted upload: their whole samples are indexed, any after the cut are missing; upload "
                       "them again, and pass --strict to refuse such shards)")
        return out


def list_shards(store, pattern: str = "") -> list[tuple[str, int]]:
    """``(name, size)`` of the shards: those ``pattern`` names (``{000..099}`` ranges expand), else
    every ``.tar`` under the prefix, subfolders included, in name order. One LIST either way (never
    a request per shard); ConfigError naming the first shards a pattern names that are not there."""
    if not pattern:
        return list_objects(store, ".tar")
    names = [check_name(n, store.url) for n in expand(pattern)]
    folders = {n.rpartition("/")[0] for n in names}
    sizes = {}
    for folder in sorted(folders):  # the pattern's folders only, not the whole prefix
        listed = list_objects(store, "", under=folder, empty_ok=True)
        sizes.update({f"{folder}/{n}" if folder else n: size for n, size in listed})
    missing = [n for n in names if n not in sizes]
    if missing:
        raise ConfigError(f"{store.url}: {len(missing)} of the {len(names)} shard(s) the pattern {pattern!r} names "
                          f"are not there ({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}); check "
                          "the pattern's range")
    return [(n, sizes[n]) for n in names]


def list_objects(store, suffix: str, under: str = "", empty_ok: bool = False,
                 versions: bool = False) -> list[tuple]:
    """``(name, size)`` of every object under the store (or its folder ``under``) whose name ends with
    ``suffix``, subfolders included (hidden ones not), names relative to ``under``, in name order;
    ``versions``: ``(name, size, version)``, the version changing whenever the object is written
    again. ConfigError when there is none (unless ``empty_ok``)."""
    if isinstance(store, LocalStore):
        if not os.path.isdir(store.root):
            what = "is a file, not a folder" if os.path.exists(store.root) else "no such path: it does not exist"
            kind = f"{suffix} files" if suffix else "files"
            raise ConfigError(f"{store.root}: {what}; give the folder (or s3:// prefix) that holds the {kind}")
        found = []
        top = os.path.join(store.root, under) if under else store.root
        for folder, dirs, files in os.walk(top, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            rel = os.path.relpath(folder, top)
            for f in files:
                if f.endswith(suffix) and not f.startswith("."):
                    st = os.stat(os.path.join(folder, f))
                    name = (f if rel == "." else f"{rel}/{f}").replace(os.sep, "/")
                    found.append((name, st.st_size, f"{st.st_ino}-{st.st_mtime_ns}") if versions else
                                 (name, st.st_size))
        found.sort()
    else:
        found = [x for x in store.list(suffix, under=under, versions=versions)
                 if not x[0].rsplit("/", 1)[-1].startswith(".")]
    if not found and not empty_ok:
        raise ConfigError(f"{store.url}: no {suffix} files there" + (
            "; name the shards with a pattern such as shard-{000000..000099}.tar, or check the location"
            if suffix == ".tar" else "; check the location"))
    return found


def expand(pattern: str) -> list[str]:
    """``shard-{000..002}.tar`` -> ``shard-000.tar``, ``shard-001.tar``, ``shard-002.tar`` (zero padding kept)."""
    m = BRACES.search(pattern)
    if not m:
        if "{" in pattern or "}" in pattern:
            raise ConfigError(f"shard pattern {pattern!r}: braces must hold a range such as {{000000..000099}}")
        return [pattern]
    a, b = m.group(1), m.group(2)
    if int(b) < int(a):
        raise ConfigError(f"shard pattern {pattern!r}: the range {a}..{b} runs backwards")
    width = len(a) if a.startswith("0") else 0
    return [x for k in range(int(a), int(b) + 1)
            for x in expand(pattern[:m.start()] + str(k).zfill(width) + pattern[m.end():])]


def split_source(src: str) -> tuple[str, str]:
    """``(prefix, pattern)`` of a source given as ``s3://b/p/shard-{000..009}.tar`` or one ``.tar`` (pattern
    "" for a folder or prefix)."""
    if "{" not in src and not src.endswith(".tar"):
        return src, ""
    head = src.partition("{")[0] if "{" in src else src
    prefix = head.rsplit("/", 1)[0] if "/" in head else "."
    return prefix, src[len(prefix) + 1:] if prefix != "." else src


class _Shard:
    """One tar's samples, walked once: columns for the index, skips counted."""

    def __init__(self, name: str, size: int, rule: LabelRule, image_exts: tuple[str, ...], on_corrupt: OnCorrupt,
                 where: str, strict: bool = False) -> None:
        self.name, self.size, self.rule, self.image_exts, self.on_corrupt = name, size, rule, image_exts, on_corrupt
        self.where, self.strict = where, strict
        self.unended = False  # cut at a member boundary: its end-of-archive blocks are missing
        self.samples: list[tuple[int, int, bytes | None, str, int]] = []  # offset, length, label bytes, key, CRC32C
        self.skipped: Counter = Counter()
        self.examples: list[str] = []

    def walk(self, store) -> "_Shard":
        """Read the shard once; its samples in the order of their images in it."""
        reader = ForwardReader(store, self.name, self.size)
        keys: dict[str, dict] = {}  # a sample's members need not be adjacent (``tar cf`` without --sort)
        repeated: dict[str, str] = {}  # key -> an extension met twice
        last = None
        damage: TarError | None = None
        try:
            for m in members(reader, self._wanted, self.where, MAX_LABEL_BYTES, summed=self._summed):
                k, ext = _key(m.name)
                if not ext or k.rpartition("/")[2].startswith("."):
                    continue  # no extension (a README) or hidden (macOS's ._ files): not part of a sample
                parts, ext = keys.setdefault(k, {}), ext.lower()
                if ext in parts:
                    repeated[k] = ext
                parts[ext] = m
                last = k
        except Unended as exc:
            if self.strict:
                raise ConfigError(f"{exc}; upload the shard again (without --strict its whole samples are indexed "
                                  "and the shard is named in the summary)") from None
            self.unended, damage = True, exc
        except TarError as exc:
            damage = exc
        cut = self._cut(damage, keys, repeated, last)
        if self.unended and cut:
            problem = self._problem(cut, keys[cut], repeated.get(cut, ""))
            if self.on_corrupt is not OnCorrupt.SKIP:
                raise ConfigError(f"{problem}; the shard ends right after it without its end-of-archive blocks (cut "
                                  "short, as by an interrupted upload): upload the shard again, or pass --on-corrupt "
                                  "skip to index its whole samples") from None
            self._skip("cut short by their shard's end", f"{self.where} sample {cut!r} (the shard was cut short)")
        broken = None if self.unended else damage
        named = f" (sample {cut!r} is cut)" if cut else f" (after sample {last!r}, whole)" if last else ""
        if broken is not None and self.on_corrupt is not OnCorrupt.SKIP:
            raise ConfigError(f"{broken}{named}; replace the shard, leave it out with a pattern, or pass "
                              "--on-corrupt skip to index the whole samples before the damage") from None
        for k, parts in keys.items():
            if k != cut:
                self._sample(k, parts, repeated.get(k, ""))
        if broken is not None:
            self._skip("damaged shard(s)", f"{broken}{named}; its {len(self.samples)} whole sample(s) indexed",
                       first=True)
        self.samples.sort(key=lambda sample: sample[0])  # offsets rise within a shard: blocks are byte ranges
        return self

    def _cut(self, damage: TarError | None, keys: dict, repeated: dict, last: str | None) -> str | None:
        """The key of the sample the damage cut, None when it fell between samples: the key of the member whose
        data runs past the end; else (a cut header, or the shard's end) the last sample met, if it is incomplete
        (a sample whose members are all there is whole)."""
        if damage is None:
            return None
        if damage.member:
            k, ext = _key(damage.member)
            return k if ext and not k.rpartition("/")[2].startswith(".") else None
        return last if last is not None and self._problem(last, keys[last], repeated.get(last, "")) else None

    def _summed(self, name: str) -> bool:
        return _key(name)[1].lower() in self.image_exts

    def _wanted(self, name: str) -> bool:
        return _key(name)[1].lower() == ("json" if self.rule.path else self.rule.ext)

    def _problem(self, key: str, parts: dict, repeated: str) -> UnindexableSample | None:
        """Why the sample cannot be indexed, or None."""
        try:
            self._check(key, parts, repeated)
        except UnindexableSample as exc:
            return exc
        return None

    def _sample(self, key: str, parts: dict, repeated: str) -> None:
        try:
            image, label = self._check(key, parts, repeated)
        except UnindexableSample as exc:
            if self.on_corrupt is not OnCorrupt.SKIP:
                raise ConfigError(f"{exc}; fix the shard, or pass --on-corrupt skip to leave such samples out "
                                  "(counted)") from None
            self._skip(exc.reason, str(exc))
            return
        self.samples.append((image.offset, image.size, label.data, f"{self.where} sample {key!r}", image.crc32c))

    def _check(self, key: str, parts: dict, repeated: str) -> tuple:
        """The sample's image and label members; UnindexableSample naming what is wrong with it."""
        where = f"{self.where} sample {key!r}"
        image = next((parts[e] for e in self.image_exts if e in parts), None)
        label = parts.get("json" if self.rule.path else self.rule.ext)
        if repeated:
            raise UnindexableSample(f"{where} has more than one .{repeated} member (two samples with one key?)",
                                    "with repeated members")
        if image is None:
            others = sorted(e for e in parts if e.rsplit(".", 1)[-1] in OTHER_IMAGES)
            if others:
                raise UnindexableSample(f"{where}: image type .{others[0]} is not read; accepted: "
                                        f"{', '.join('.' + e for e in self.image_exts)}", "of unsupported image types")
            raise UnindexableSample(f"{where} has no image member ({', '.join('.' + e for e in self.image_exts)}; "
                                    f"it has {', '.join('.' + e for e in sorted(parts))})", "without an image")
        if label is None:
            raise UnindexableSample(f"{where} has no .{'json' if self.rule.path else self.rule.ext} member to read "
                                    f"its label from (rule {self.rule.rule!r}){_label_hint(parts, image)}",
                                    "without a label member")
        if label.data is None:  # the walk leaves a label member over the cap unread
            raise UnindexableSample(f"{where}: its label member {label.name!r} holds {label.size} bytes, more than "
                                    f"the {MAX_LABEL_BYTES}-byte cap on a label member (labels are read into memory)",
                                    "with an oversized label member")
        return image, label

    def _skip(self, reason: str, example: str, first: bool = False) -> None:
        self.skipped[reason] += 1
        if first:  # a damaged shard is named before its samples skipped for other reasons
            self.examples.insert(0, example)
            del self.examples[3:]
        elif len(self.examples) < 3:
            self.examples.append(example)


def _label_hint(parts: dict, image) -> str:
    """Where the sample's label may be instead (its other members), as the ``--label`` to pass."""
    others = sorted(e for e in parts if parts[e] is not image and e not in IMAGE_EXTS and e not in OTHER_IMAGES)
    if "json" in others:
        return ("; it has a .json member: pass --label json:FIELD, FIELD the field of <key>.json holding the "
                "label (dotted for a nested one)")
    if others:
        return f"; it has {', '.join('.' + e for e in others)}: pass --label {others[0]} to read the label from it"
    return ""


def _key(name: str) -> tuple[str, str]:
    m = KEY.match(name)
    return (m.group(1), m.group(2)) if m else (name, "")


def index_tars(src, dest: str = "", *, pattern: str = "", label: str = "cls", classes: list[str] | None = None,
               image_exts: tuple[str, ...] = IMAGE_EXTS, on_corrupt: OnCorrupt | str = OnCorrupt.FAIL, workers: int = 8,
               overwrite: bool = False, strict: bool = False, request_timeout_s: float = 60.0,
               progress: Callable[[int, int], None] | None = None) -> IndexSummary:
    """Write ``index.bin`` for the WebDataset tars at ``src`` (a folder, an ``s3://`` prefix or a Store) to
    ``dest`` (default ``src``), reading each shard once and writing nothing else.

    Args:
        pattern: the shards' names under ``src`` (``shard-{000000..000099}.tar``); "" lists every ``.tar``.
        label: the :class:`LabelRule` (``cls``, ``txt``, ``json:FIELD``). classes: class names in label order.
        image_exts: the image extensions taken, in order of preference.
        on_corrupt: ``"fail"`` stops at the first bad sample or shard, naming it; ``"skip"`` leaves it
            out and counts it in the summary.
        workers: shards read at once. overwrite: replace an index already at ``dest``.
        strict: refuse a shard without its end-of-archive blocks (cut at a member boundary); without it
            such a shard's whole samples are indexed and the shard is named in the summary.
        progress: called with (1, the shard's bytes) after each shard is indexed.

    Raises:
        ConfigError: no shards, a bad option, a bad sample or shard (``on_corrupt="fail"``), an index
            already at ``dest`` (without ``overwrite``), a location that cannot be read or written.
    """
    on_corrupt = OnCorrupt.parse(on_corrupt)
    check_integer("workers", workers, 1)
    bad = [e for e in image_exts if e.lower() not in IMAGE_EXTS]
    if bad or not image_exts:
        raise ConfigError(f"image extensions {', '.join(bad) or '(none)'}: choose among {', '.join(IMAGE_EXTS)}")
    image_exts = tuple(e.lower() for e in image_exts)
    rule = LabelRule(label, classes)
    store = open_store(src, what="source", request_timeout_s=request_timeout_s) if isinstance(src, str) else src
    out = open_store(dest, what="dest", create=True, request_timeout_s=request_timeout_s) if dest else store
    if not overwrite and (out.exists(INDEX_NAME) or out.exists(JSON_INDEX_NAME)):
        raise ConfigError(f"{out.url} already holds an index; pass --overwrite to replace it, or --to another place")
    shards = list_shards(store, pattern)
    summary = IndexSummary(shards=len(shards))
    before = store.bytes_read
    base = store.url.rstrip("/")
    with IndexWriter(out.root if isinstance(out, LocalStore) else "") as writer:
        for shard in _walked(store, shards, rule, image_exts, on_corrupt, base, workers, strict):
            kept, labels = _labelled(rule, shard, on_corrupt)
            if shard.unended:
                summary.unended.append(shard.name)
            writer.add_shard(shard.name, shard.size, [s[0] for s in kept], [s[1] for s in kept], labels,
                             sample_crcs([s[4] for s in kept], labels))  # each image's CRC32C, then its label
            summary.skipped.update(shard.skipped)
            summary.examples += shard.examples[:3 - len(summary.examples)]
            if progress is not None:
                progress(1, shard.size)
        summary.samples, summary.data_bytes = len(writer), writer.data_bytes
        if not summary.samples:
            raise ConfigError(f"{base}: no samples with an image ({', '.join(image_exts)}) and a label by "
                              f"{label!r} in {len(shards)} shard(s)" +
                              (f"; skipped {dict(summary.skipped)}" if summary.skipped else ""))
        summary.classes = rule.final_classes()
        writer.store(out, summary.classes)
    summary.bytes_read = store.bytes_read - before
    summary.index = f"{out.url.rstrip('/')}/{INDEX_NAME}"
    return summary


def _walked(store, shards, rule, image_exts, on_corrupt, base, workers, strict):
    """The shards walked ``workers`` at a time, in order; at most ``2 * workers`` held at once."""
    with ThreadPoolExecutor(workers, thread_name_prefix="tar-index") as pool:
        pending: collections.deque[Future[_Shard]] = collections.deque()
        for name, size in shards:
            shard = _Shard(name, size, rule, image_exts, on_corrupt, f"{base}/{name}", strict)
            pending.append(pool.submit(shard.walk, store))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _labelled(rule: LabelRule, shard: _Shard, on_corrupt: str) -> tuple[list, list[int]]:
    """The shard's samples that have a label, and their labels (in shard order: names are numbered as met)."""
    kept, labels = [], []
    for sample in shard.samples:
        try:
            labels.append(rule.label(sample[2] or b"", sample[3]))
        except UnindexableSample as exc:
            if on_corrupt is not OnCorrupt.SKIP:
                raise ConfigError(f"{exc}; fix the label, or pass --on-corrupt skip to leave such samples out "
                                  "(counted)") from None
            shard._skip(exc.reason, str(exc))
            continue
        kept.append(sample)
    return kept, labels
