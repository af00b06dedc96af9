"""``hetero index LOCATION`` on Parquet: the row checksums that files without page CRCs lack.

LOCATION is a ``.parquet`` file, or a folder or ``s3://`` prefix of them (subfolders included).
Every row group is read once and a CRC32C of each row (its image bytes and label) is written to
``parquet-rows.crc32c`` beside the files (``<name>.crc32c`` beside a single file), or to ``--to
DEST`` (then ``--hp pipeline.index=DEST``). The logic is :mod:`data_service.shards.parquet_sums`.
"""
from __future__ import annotations

import argparse


def is_parquet(src: str) -> bool:
    """Whether ``hetero index SRC`` names Parquet: a ``.parquet`` file, or a location holding
    ``.parquet`` files and no ``.tar`` shards."""
    if src.endswith(".parquet"):
        return True
    if "{" in src or src.endswith(".tar"):
        return False
    from data_service.errors import ConfigError
    from data_service.shards.wds_index import list_objects
    from data_service.storage import open_store

    try:
        store = open_store(src, what="source")
        return not list_objects(store, ".tar", empty_ok=True) and bool(list_objects(store, ".parquet", empty_ok=True))
    except ConfigError:
        return False  # the tar path names what is wrong with the location


def train_hint(summary, source: str, dest: str, more: str = "") -> int:
    """Print ``summary`` and how to train on what was indexed (``--hp pipeline.SOURCE``); 0."""
    for line in summary.lines():
        print(line)
    hint = f" --hp pipeline.index={dest}" if dest else ""
    print(f"train on them: --hp pipeline=data_service.pipelines.images:build_pipeline --hp pipeline.{source}"
          f"{hint}{more}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Write the row checksums of ``args.src``; the product's errors are ``hetero index``'s to say."""
    from data_service.errors import ConfigError
    from data_service.shards.parquet_sums import index_parquet, place
    from data_service.shards.wds_index import list_objects
    from data_service.storage import open_store
    from hetero.console import progress_bar

    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: give at least 1 (files read at once)")
    folder, out_folder, key = place(args.src, args.dest)
    store = open_store(folder, what="parquet")
    out = open_store(out_folder, what="dest", create=True) if args.dest else store
    if out.exists(key) and not args.overwrite:
        raise ConfigError(f"{out.key_url(key)} already exists; pass --overwrite to replace it")
    name = args.src.rstrip("/").rpartition("/")[2]
    total = store.check(name) if args.src.endswith(".parquet") else sum(
        size for _, size in list_objects(store, ".parquet"))  # the bar's total
    with progress_bar(total, "checksumming Parquet rows", args.quiet) as bar:
        summary = index_parquet(args.src, args.dest, image_column=args.image_column, label_column=args.label_column,
                                workers=args.workers, overwrite=args.overwrite, progress=bar.update)
    columns = "".join(f" --hp pipeline.{k}={v}" for k, v in (("image_column", args.image_column),
                                                               ("label_column", args.label_column))
                      if v != k.split("_")[0])
    return train_hint(summary, f"parquet={args.src}", args.dest,
                      f"{columns} (add --hp pipeline.unchecked=refuse to refuse any file left unchecked)")
