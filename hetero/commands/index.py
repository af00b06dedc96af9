"""``hetero index SRC [--to DEST]``: an index for WebDataset tar shards written elsewhere, read in place.

SRC is a folder or ``s3://bucket/prefix`` of ``.tar`` shards (every one under it, subfolders
included), or a brace pattern such as ``s3://b/laion/{00000..00099}.tar``. Each shard is read
once; nothing is written but ``index.bin``, to DEST (a read-only source's index goes elsewhere) or
else beside the shards. Train on them with ``--hp pipeline.shards=SRC`` (and
``--hp pipeline.index=DEST``). The logic is :mod:`data_service.shards.wds_index`.

``hetero index --from-json SRC [--to DEST]`` converts the ``index.json`` of shards an earlier
``hetero prepare`` wrote to ``index.bin``, reading the shards once for the per-sample checksums.
``hetero index --upgrade SRC [--to DEST]`` rewrites an earlier release's ``index.bin`` so each
sample's checksum covers its label too (the shards are read only when it holds no checksums).

``hetero index SRC`` where SRC holds Parquet files (and no tars) writes their rows' checksums
instead (:mod:`.index_parquet`).
"""
from __future__ import annotations

import argparse
import sys

from data_service.errors import ConfigError, DataServiceError


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "index", "index WebDataset tar shards written by other tools, to read them in place; "
                                  "write row checksums for Parquet files",
                    "Reads each .tar shard under SRC once, front to back, and writes index.bin "
                    "(where each sample's image lies, and its label) to DEST or beside the shards. "
                    "A sample is the members sharing a key (the path up to the first dot of its "
                    "name); its image is the .jpg/.jpeg/.png/.webp member, its label read by --label. "
                    "The shards are never rewritten. Where SRC holds .parquet files (and no tars), "
                    "reads every row group once and writes a CRC32C of each row (image bytes and "
                    "label) to parquet-rows.crc32c at DEST or beside them: the check that files "
                    "written without page CRCs (pyarrow's default) lack.")
    p.add_argument("src", help="folder or s3://bucket/prefix of .tar shards, or a pattern: "
                               "s3://b/p/shard-{000000..000099}.tar; or a .parquet file, folder or prefix of them")
    p.add_argument("--to", dest="dest", default="", metavar="DEST",
                   help="where to write index.bin or the Parquet row checksums (a folder or s3:// prefix; "
                        "default: SRC itself)")
    p.add_argument("--label", default="cls",
                   help="where each sample's label is: cls (default; the <key>.cls member), txt, any other "
                        "extension, or json:FIELD (a field of <key>.json, dotted for nested fields)")
    p.add_argument("--classes", default="",
                   help="class names in label order, comma-separated or @FILE (one per line): maps names "
                        "to indices and names indices (default: integers as they are; names numbered as met)")
    p.add_argument("--image", default="jpg,jpeg,png,webp",
                   help="image extensions taken, in order of preference (default jpg,jpeg,png,webp)")
    p.add_argument("--on-corrupt", choices=("fail", "skip"), default="fail",
                   help="a sample without its label or with another image type, or a damaged shard: stop "
                        "naming it (fail, default) or leave it out and count it (skip)")
    p.add_argument("--strict", action="store_true",
                   help="refuse a shard without its end-of-archive blocks (cut short, as by an interrupted upload) "
                        "instead of indexing its whole samples and naming it in the summary")
    p.add_argument("--workers", type=int, default=8, help="shards read at once (default 8)")
    p.add_argument("--overwrite", action="store_true", help="replace an index already at DEST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--from-json", action="store_true",
                   help="convert SRC's index.json (hetero prepare's earlier index) to index.bin, at DEST or beside it")
    p.add_argument("--upgrade", action="store_true",
                   help="rewrite SRC's index.bin of an earlier release (checksums over the samples' bytes alone, or "
                        "none) so each sample's checksum covers its bytes and its label; the old index is checked "
                        "whole first, the shards read only when it holds no checksums")
    p.add_argument("--image-column", default="image",
                   help="Parquet: the column of image bytes the checksums cover (default image)")
    p.add_argument("--label-column", default="label",
                   help="Parquet: the column of labels the checksums cover (default label)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from . import index_parquet

    work = (_from_json if args.from_json else _upgrade if args.upgrade
            else index_parquet.run if index_parquet.is_parquet(args.src) else _tars)
    try:
        return work(args)
    except DataServiceError as exc:
        print(f"hetero index: {exc}", file=sys.stderr)
        return 2


def _tars(args: argparse.Namespace) -> int:
    from data_service.shards.format import INDEX_NAME, JSON_INDEX_NAME
    from data_service.shards.wds_index import index_tars, list_shards, split_source
    from data_service.storage import open_store
    from hetero.console import progress_bar

    from .index_parquet import train_hint

    options = _tar_options(args)
    src, pattern = split_source(args.src)
    store = open_store(src, what="source")
    out = open_store(args.dest, what="dest", create=True) if args.dest else store
    if not args.overwrite and (out.exists(INDEX_NAME) or out.exists(JSON_INDEX_NAME)):
        raise ConfigError(f"{out.url} already holds an index; pass --overwrite to replace it, or --to another place")
    shards = list_shards(store, pattern)  # the bar's total, once the destination is known to be free
    with progress_bar(sum(size for _, size in shards), "indexing shards", args.quiet) as bar:
        summary = index_tars(store, args.dest, pattern=pattern, **options,
                             progress=lambda _shards, size: bar.update(size))
    return train_hint(summary, f"shards={src}", args.dest)


def _tar_options(args: argparse.Namespace) -> dict:
    """``index_tars``' options from the command line, checked before anything is read or shown."""
    from data_service.shards.labels import LabelRule
    from data_service.shards.wds_index import IMAGE_EXTS

    classes = _classes(args.classes)
    LabelRule(args.label, classes)  # a bad --label names itself here
    exts = tuple(e.strip().lstrip(".").lower() for e in args.image.split(",") if e.strip())
    if not exts or any(e not in IMAGE_EXTS for e in exts):
        raise ConfigError(f"--image {args.image!r}: give image extensions among {','.join(IMAGE_EXTS)}")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: give at least 1 (shards read at once)")
    return {"label": args.label, "classes": classes, "image_exts": exts, "on_corrupt": args.on_corrupt,
            "workers": args.workers, "overwrite": args.overwrite, "strict": args.strict}


def _classes(spec: str) -> list[str] | None:
    if not spec:
        return None
    if spec.startswith("@"):
        try:
            with open(spec[1:], encoding="utf-8") as f:
                names = [line.strip() for line in f if line.strip()]
        except OSError as exc:
            raise ConfigError(f"--classes {spec}: cannot read the file ({exc})") from None
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise ConfigError(f"--classes {spec!r} must name each class once (comma-separated, or @FILE one per line)")
    return names


def _from_json(args: argparse.Namespace) -> int:
    from data_service.shards.format import INDEX_NAME, JSON_INDEX_NAME, ShardIndex
    from data_service.shards.indexfile import write_index
    from data_service.storage import open_store

    store = open_store(args.src, what="source")
    out = open_store(args.dest, what="dest", create=True) if args.dest else store
    if not store.exists(JSON_INDEX_NAME):
        print(f"hetero index: {store.url.rstrip('/')} has no index.json to convert", file=sys.stderr)
        return 2
    if out.exists(INDEX_NAME) and not args.overwrite:
        print(f"hetero index: {out.url} already holds {INDEX_NAME}; pass --overwrite to replace it", file=sys.stderr)
        return 2
    where = f"{store.url.rstrip('/')}/{JSON_INDEX_NAME}"
    index = ShardIndex.from_json(store.read(JSON_INDEX_NAME), where)
    write_index(out, index, shards=store)  # reads the shards once for their checksums
    print(f"wrote {out.url.rstrip('/')}/{INDEX_NAME}: {len(index)} samples in {len(index.shards)} shard(s), "
          f"{len(index.classes)} classes (from {where})")
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    from data_service.shards.upgrade import upgrade_index

    index = upgrade_index(args.src, args.dest, overwrite=args.overwrite)
    print(f"wrote {(args.dest or args.src).rstrip('/')}/index.bin: {len(index)} samples in {len(index.shards)} "
          "shard(s), each sample's checksum over its bytes and its label")
    return 0
