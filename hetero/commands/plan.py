"""``hetero plan``: the cheapest data group that keeps the GPUs fed, from measured figures.

Give the per-batch preprocessing cost on one core (``--preprocess-s``, or ``--profile`` to
measure it here), the GPU step time with resident data and the batch size; the planner
(hetero/planning/planner.py) prices every CPU instance type of the table and recommends the
cheapest type and count with data wait under ``--target-wait``, beside the homogeneous
alternative. Exit codes: 0 a recommendation, 1 none meets the target, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("plan", help="recommend a data group (instance type and count) and its $/step",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--dnn-instance", default="ml.p3.2xlarge", help="GPU instance type (default ml.p3.2xlarge)")
    p.add_argument("--dnn-count", type=int, default=1, help="GPU instances (default 1)")
    p.add_argument("--gpu-step-s", type=float, required=True, help="GPU step time with the batch already resident")
    p.add_argument("--preprocess-s", type=float, default=None, help="seconds to build one batch on one CPU core")
    p.add_argument("--batch-size", type=int, default=None, help="samples per batch (per GPU)")
    p.add_argument("--profile", action="store_true", help="measure --preprocess-s here: build a few batches on one core")
    p.add_argument("--pipeline", default="examples.mnist:build_pipeline", help="pipeline to profile (import path)")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", help="pipeline option (JSON value)")
    p.add_argument("--profile-batches", type=int, default=5, help="batches timed by --profile (default 5)")
    p.add_argument("--target-wait", type=float, default=0.05, help="highest data-wait share (default 0.05 = 5%%)")
    p.add_argument("--data-types", default="", help="comma-separated CPU instance types (default: all without GPUs)")
    p.add_argument("--max-count", type=int, default=16, help="most data instances of one type (default 16)")
    p.add_argument("--reserve-cpus", type=int, default=1, help="vCPUs per GPU left to the trainer (default 1)")
    p.add_argument("--efficiency", type=float, default=1.0, help="data-path scaling efficiency, 0-1 (default 1)")
    p.add_argument("--local-server", action="store_true", help="GPU instances' spare vCPUs build batches too "
                   "(launcher option dnn_local_server=true)")
    p.add_argument("--epoch-samples", type=int, default=0, help="samples per epoch, for $/epoch")
    p.add_argument("--prices", default=None, help="price file merged over hetero/planning/prices.json")
    p.add_argument("--compare", action="append", default=[], metavar="KEY=VALUE",
                   help="with --profile: also profile the pipeline with this option changed and price the data "
                        "group it needs beside (e.g. decode=whole: what the fused crop-and-decode saves)")
    p.add_argument("--json", type=Path, default=None, help="write the plan here")
    p.set_defaults(func=run)


def _profile(args: argparse.Namespace, options: dict, label: str = "") -> tuple[float, int]:
    import os

    from hetero.planning.profile import profile_pipeline

    tmp = None
    if (args.pipeline == "examples.mnist:build_pipeline" and "data_dir" not in options
            and not os.environ.get("SM_CHANNEL_TRAINING")):
        from hetero.synthetic_mnist import write_synthetic

        tmp = tempfile.TemporaryDirectory(prefix="hetero-plan-")
        write_synthetic(tmp.name, 2048, 0)
        options = {**options, "data_dir": tmp.name}
        print("profiling on synthetic MNIST (no data_dir option, no SM_CHANNEL_TRAINING)")
    try:
        prof = profile_pipeline(args.pipeline, options, batches=args.profile_batches)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(f"profile{label}: {prof.median_s * 1000:.1f} ms per batch of {prof.batch_size} on CPU {prof.cpu} "
          f"(median of {args.profile_batches}; {prof.min_s * 1000:.1f}-{prof.max_s * 1000:.1f} ms)")
    return prof.median_s, prof.batch_size


def compare_line(kv: str, preprocess_s: float, result, other_s: float, other) -> str:
    """One line: the data group the pipeline needs as given against with ``kv``, and the $/h between."""
    def group(p) -> str:
        r = p.recommended
        if r is None:
            return "no data group meets the target"
        return f"{r.data_count} x {r.data_instance}, ${r.usd_per_hour:.2f}/h" if r.data_instance else \
            f"no data node, ${r.usd_per_hour:.2f}/h"
    line = (f"compare: with {kv} a batch takes {other_s * 1000:.1f} ms on one core against {preprocess_s * 1000:.1f} "
            f"({other_s / preprocess_s:.2f}x) and needs {group(other)}; as given: {group(result)}")
    if result.recommended and other.recommended:
        saved = other.recommended.usd_per_hour - result.recommended.usd_per_hour
        line += f" ({'saves' if saved >= 0 else 'costs'} ${abs(saved):.2f}/h)"
    return line


def run(args: argparse.Namespace) -> int:
    from hetero.planning.cost import PriceError, load_prices
    from hetero.planning.planner import PlanError, format_plan, plan
    from data_service.errors import ConfigError
    from hetero.cli import setup_logging
    from hetero.options import parse_kv

    setup_logging("plan", args.log_level)
    try:
        table = load_prices(args.prices)
        table.info(args.dnn_instance)
        types = [t.strip() for t in args.data_types.split(",") if t.strip()]
        for t in types:
            table.info(t)
        if args.profile:
            options = parse_kv(args.option)
            if args.batch_size:
                options["batch_size"] = args.batch_size
            preprocess_s, batch_size = _profile(args, options)
        else:
            if args.preprocess_s is None or args.batch_size is None:
                raise PlanError("give --preprocess-s and --batch-size (measured figures), or --profile to measure them")
            preprocess_s, batch_size = args.preprocess_s, args.batch_size
        if args.compare and not args.profile:
            raise PlanError("--compare needs --profile (it profiles the pipeline with the option changed)")

        def plan_for(preprocess_s: float, batch_size: int):
            return plan(table, args.dnn_instance, preprocess_s, args.gpu_step_s, batch_size, dnn_count=args.dnn_count,
                        data_types=types or None, max_count=args.max_count, target_wait=args.target_wait,
                        reserve_cpus=args.reserve_cpus, efficiency=args.efficiency, local_server=args.local_server,
                        epoch_samples=args.epoch_samples)
        result = plan_for(preprocess_s, batch_size)
        compared = []
        for kv in args.compare:
            changed = {**options, **parse_kv([kv])}
            other_s, other_batch = _profile(args, changed, f" with {kv}")
            compared.append((kv, other_s, plan_for(other_s, other_batch)))
    except (PriceError, PlanError, ConfigError, ValueError) as exc:
        print(f"hetero plan: {exc}")
        return 2
    print(format_plan(result))
    for kv, other_s, other in compared:
        print(compare_line(kv, preprocess_s, result, other_s, other))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        print(f"plan: {args.json}")
    return 0 if result.recommended else 1
