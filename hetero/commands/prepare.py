"""``hetero prepare SRC DEST``: write an image folder (or a map-style data set) as shards plus an index.

DEST is a local folder or ``s3://bucket/prefix``; the image pipeline reads it with
``--hp pipeline.shards=DEST`` (docs/shards.md).
"""
from __future__ import annotations

import argparse
import os
import sys


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "prepare", "write an image folder as WebDataset-compatible tar shards + index "
                                    "(a local folder or s3://)",
                    "Reads SRC (an image folder root/<class>/*.jpg, or pkg.mod:fn returning a "
                    "map-style data set of (image bytes or uint8 [C,H,W] tensor, label)), checks "
                    "that every image decodes, shuffles the samples once (a fixed seed) and writes "
                    "tar shards (<key>.jpg + <key>.cls members, readable by the webdataset library) "
                    "and index.bin to DEST. Files that do not decode are skipped and listed. "
                    "Several machines share the work with --part I/N, then --merge DEST; a run "
                    "started again keeps the shards it finished.")
    p.add_argument("src", nargs="?", help="image folder, or pkg.mod:fn (options with -o key=value)")
    p.add_argument("dest", nargs="?",
                   help="local folder or s3://bucket/prefix (AWS_ENDPOINT_URL for S3-compatible stores)")
    p.add_argument("--part", metavar="I/N",
                   help="write only part I of N disjoint parts of the shards (one per machine, same SRC, DEST "
                        "and options on each), no index; then `hetero prepare --merge DEST`. Started again after "
                        "a crash, a part keeps the shards it finished")
    p.add_argument("--merge", metavar="DEST", help="write the index of DEST once every part is done")
    sm = p.add_argument_group("as a SageMaker job (SRC and DEST in S3; one part per instance, the first merges)")
    sm.add_argument("--sagemaker", type=int, metavar="N", help="run on N instances of --instance-type")
    sm.add_argument("--instance-type", help="e.g. the data group's type, ml.c5.9xlarge")
    sm.add_argument("--role", help="execution role ARN (S3 read on SRC, read/write on DEST)")
    sm.add_argument("--output", help="s3:// prefix for the job's source archive and output")
    sm.add_argument("--region", help="AWS region (default: boto3's)")
    sm.add_argument("--image", help="training image URI (default: the AWS PyTorch image of --framework-version)")
    sm.add_argument("--framework-version", default="2.5", help="AWS PyTorch training image version (default 2.5)")
    sm.add_argument("--volume-gb", type=int, default=100, help="EBS volume per instance (staging shards)")
    sm.add_argument("--max-run", type=int, default=24 * 3600, metavar="S", help="the job's run time bound, s")
    sm.add_argument("--job-name", help="default hetero-prepare-<time>")
    sm.add_argument("--dry-run", action="store_true", help="print the checked request; send nothing")
    p.add_argument("--shard-size", default="256MB", help="bytes per shard, e.g. 64MB, 256MB, 1GB (default 256MB)")
    p.add_argument("--max-side", type=int, default=0, metavar="N",
                   help="re-encode images whose long side exceeds N px (JPEG q95, antialiased; default 0: keep all)")
    p.add_argument("--workers", type=int, default=0, help="processes reading and checking files (default: every core)")
    p.add_argument("--shuffle-seed", type=int, default=0, help="seed of the order samples are written in (default 0)")
    p.add_argument("--no-shuffle", action="store_true",
                   help="write samples in the source's order (class after class): block shuffling then mixes "
                        "classes far less (docs/shards.md)")
    p.add_argument("--no-verify", action="store_true", help="do not decode each image (faster; corrupt files kept)")
    p.add_argument("--overwrite", action="store_true", help="replace shards already at DEST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword option of a pkg.mod:fn source (value parsed as JSON when it parses)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from data_service.errors import DataServiceError
    from data_service.storage import parse_size
    from hetero.options import parse_kv
    from data_service.prepare.writer import merge_parts, prepare

    if args.sagemaker is not None:
        return _sagemaker(args)
    if args.merge and (args.src or args.dest or args.part):
        print("hetero prepare: --merge DEST takes no SRC, DEST or --part", file=sys.stderr)
        return 2
    if not args.merge and not (args.src and args.dest):
        print("hetero prepare: give SRC and DEST (or --merge DEST)", file=sys.stderr)
        return 2
    dest = args.merge or args.dest
    try:
        if args.merge:
            summary = merge_parts(dest)
        else:
            summary = prepare(args.src, dest, shard_size=parse_size(args.shard_size, "--shard-size"),
                              max_side=args.max_side, workers=args.workers,
                              shuffle_seed=None if args.no_shuffle else args.shuffle_seed, overwrite=args.overwrite,
                              verify=not args.no_verify, progress=not args.quiet, options=parse_kv(args.option),
                              part=args.part)
    except DataServiceError as exc:
        print(f"hetero prepare: {exc}", file=sys.stderr)
        return 2
    for line in summary.lines(dest):
        print(line)
    if summary.part:
        print(f"when every part is done: hetero prepare --merge {dest}")
        return 0
    # a URL as given, a local folder as an absolute path: the same folder from wherever the job runs here
    shards = dest if "://" in dest else os.path.abspath(os.path.expanduser(dest))
    print(f"train on them: --hp pipeline=data_service.pipelines.images:build_pipeline --hp pipeline.shards={shards}")
    return 0


def _sagemaker(args: argparse.Namespace) -> int:
    import json

    from data_service.errors import DataServiceError
    from data_service.storage import parse_size
    from hetero.sagemaker.client import resolve_region
    from hetero.sagemaker.images import training_image
    from hetero.sagemaker.prepare_job import prepare_spec, submit
    from hetero.sagemaker.request import default_job_name
    from hetero.sagemaker.source import source_uri
    from hetero.sagemaker.spec import SubmitError, check_s3_uri

    try:
        if not (args.src and args.dest) or args.part or args.merge:
            raise SubmitError("--sagemaker N takes SRC and DEST (s3://), no --part or --merge (each instance "
                              "writes one part, the first merges)")
        missing = [o for o, v in (("--instance-type", args.instance_type), ("--role", args.role),
                                  ("--output", args.output)) if not v]
        if missing:
            raise SubmitError(f"--sagemaker needs {', '.join(missing)}")
        region = resolve_region(args.region)
        image = args.image or training_image(args.framework_version, region, [args.instance_type])[0]
        name = args.job_name or default_job_name("prepare")
        output = check_s3_uri(args.output, "--output")
        spec = prepare_spec(args.src, args.dest, instance_type=args.instance_type, count=args.sagemaker,
                            role=args.role, image=image, output=output, region=region, job_name=name,
                            source_s3=source_uri(output, name),
                            shard_size=parse_size(args.shard_size, "--shard-size"), max_side=args.max_side,
                            shuffle_seed=None if args.no_shuffle else args.shuffle_seed, volume_gb=args.volume_gb,
                            max_run_s=args.max_run)
        request, arn = submit(spec, region, dry_run=args.dry_run)
    except DataServiceError as exc:
        print(f"hetero prepare: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps(request, indent=1, sort_keys=True))
        return 0
    print(f"created {arn}: {args.sagemaker} x {args.instance_type}, one part each; the first writes "
          f"{args.dest}/index.bin when all are done (a part started again keeps its finished shards)")
    return 0
