"""``hetero plan``: the cheapest data group that keeps the GPUs fed, from measured figures.

Give the per-batch preprocessing cost on one core (``--preprocess-s``, or ``--profile`` to
measure it here), the GPU step time with resident data and the batch size; the planner
(hetero/planning/planner.py) prices every CPU instance type of the table and the GPU instances
alone, and recommends the cheapest per 1,000 images with data wait under ``--target-wait``: a type
and count, or no data group. The network bounds each layout too: the bytes per sample on the wire (--bytes-per-sample
as a job's data servers measured them, --profile's built batches, else a uint8 crop of --crop-size)
against each instance's NIC baseline and the single-flow cap; each layout names what binds, and
when the network does, the plan prices the compact wire encodings too.
Exit codes: 0 a recommendation, 1 no layout meets the target (the GPU instances alone included), 2 bad input.
"""
from __future__ import annotations

import argparse
import sys
import json
import tempfile
from pathlib import Path
from typing import cast


def register(sub) -> None:
    from hetero.commands import HelpFormatter, plain

    p = sub.add_parser("plan", formatter_class=HelpFormatter,
                       help="recommend a data group (instance type and count) and its $/step",
                       description=plain(__doc__.split("\n\n")[1].replace("\n", " ")))
    p.add_argument("--dnn-instance", default="ml.p3.2xlarge", help="GPU instance type (default ml.p3.2xlarge)")
    p.add_argument("--dnn-count", type=int, default=1, help="GPU instances (default 1)")
    p.add_argument("--gpu-step-s", type=float, default=None, help="GPU step time with the batch already resident")
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
    p.add_argument("--bytes-per-sample", type=float, default=None,
                   help="bytes one sample takes on the wire, as the data servers measured them (a job's metrics.json: "
                        "bytes_sent / (batches_sent x batch size)); default: --profile's batches, else a uint8 crop")
    p.add_argument("--metrics", type=Path, default=None,
                   help="a finished job's metrics.json: bytes per sample from its data nodes' bytes_sent / batches_sent "
                        "(and its wire encoding)")
    p.add_argument("--crop-size", type=int, default=224,
                   help="side of the uint8 crop assumed when no bytes were measured (default 224: 150,528 bytes)")
    p.add_argument("--wire", default="uint8", help="the job's wire encoding, the one --preprocess-s/--profile and "
                   "--bytes-per-sample were measured with (uint8, up-zstd, jpeg:90, ...; default uint8)")
    p.add_argument("--placement-group", action="store_true",
                   help="the instances share a cluster placement group: one flow carries up to 10 Gbps, not 5")
    p.add_argument("--goodput", type=float, default=1.0, help="share of a NIC's Gbps that carries samples (default 1)")
    p.add_argument("--no-network", action="store_true", help="count cores only (the network is not modelled)")
    p.add_argument("--sizing", action="store_true", help="print the ResNet-50-class sizing table instead: for each "
                   "V100/A100 instance, the cheapest data group with uint8 and with jpeg:90 on the wire, and $ per "
                   "ImageNet epoch (hetero/planning/sizing.py)")
    p.add_argument("--per-core-rate", type=float, default=None,
                   help="with --sizing: images one vCPU crops and decodes per second (default: the rate measured here)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="price a sweep of N such jobs: N data groups, or one shared by all (docs/sweep.md)")
    p.add_argument("--json", type=Path, default=None, help="write the plan here")
    p.set_defaults(func=run)


def _profile(args: argparse.Namespace, options: dict, label: str = "") -> tuple[float, int, float]:
    import os

    from hetero.planning.profile import profile_pipeline

    tmp = None
    if (args.pipeline == "examples.mnist:build_pipeline" and "data_dir" not in options
            and not os.environ.get("SM_CHANNEL_TRAINING")):
        from hetero.synthetic.mnist import write_synthetic

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
          f"(median of {args.profile_batches}; {prof.min_s * 1000:.1f}-{prof.max_s * 1000:.1f} ms), "
          f"{prof.bytes_per_sample:,.0f} bytes per sample built")
    return prof.median_s, prof.batch_size, prof.bytes_per_sample


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


def metrics_bytes(path: Path, batch_size: int | None) -> tuple[float, str]:
    """(bytes per sample, wire encoding) a finished job's data nodes measured: their ``bytes_sent`` over
    ``batches_sent`` x the batch size (``batch_size``, else the job's ``pipeline_options``).

    Raises:
        hetero.planning.network.NetworkError: unreadable file, or no data node that sent a batch.
    """
    from hetero.planning.network import NetworkError, bytes_per_image_from_stats

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise NetworkError(f"--metrics {path}: cannot read it ({exc})") from None
    if not isinstance(doc, dict):
        raise NetworkError(f"--metrics {path}: expected a job's metrics.json object, got {type(doc).__name__}")
    nodes = [n for n in doc.get("nodes") or [] if isinstance(n, dict) and "bytes_sent" in n]
    for node in nodes:
        for key in ("bytes_sent", "batches_sent"):
            _count(path, f"{key} of node {node.get('host', '?')}", node.get(key, 0))
    options = doc.get("pipeline_options")
    batch = batch_size or _count(path, "pipeline_options.batch_size",
                                 (options.get("batch_size") if isinstance(options, dict) else None) or 0)
    per_sample = bytes_per_image_from_stats(sum(n["bytes_sent"] for n in nodes),
                                            sum(n.get("batches_sent", 0) for n in nodes), batch)
    if per_sample is None:
        raise NetworkError(f"--metrics {path}: no data node with bytes_sent and batches_sent (a heterogeneous job's "
                           "metrics.json has them under 'nodes'), or no batch size: give --batch-size")
    return per_sample, str(doc.get("wire_encoding") or "uint8")


def _count(path: Path, field: str, value) -> int:
    """``value`` of the metrics file's ``field`` when it is a whole number >= 0; else a NetworkError naming both."""
    from hetero.planning.network import NetworkError

    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NetworkError(f"--metrics {path}: {field}={value!r} must be a whole number >= 0 (a JSON integer, not "
                           "a string); fix the file or give --bytes-per-sample")
    return value


def network_inputs(args: argparse.Namespace, profiled_bytes: float | None) -> dict:
    """Bytes per sample on the wire (and where they come from), the job's wire encoding and the flow cap.

    Raises:
        hetero.planning.network.NetworkError: an unknown encoding or a bad figure (naming it).
    """
    from hetero.options import parse_kv
    from hetero.planning.network import (PLACEMENT_GROUP_FLOW_GBPS, SINGLE_FLOW_GBPS, NetworkError,
                                         canonical_wire, wire_encoding)

    flow = PLACEMENT_GROUP_FLOW_GBPS if args.placement_group else SINGLE_FLOW_GBPS
    args.wire = canonical_wire(args.wire)
    if args.metrics is not None and not args.no_network:
        per_sample, wire_name = metrics_bytes(args.metrics, args.batch_size)
        if args.wire == "uint8":
            args.wire = canonical_wire(wire_name)
        return {"bytes": per_sample, "wire": wire_encoding(args.wire, bytes_measured=True), "flow_gbps": flow,
                "source": f"measured by the data servers of {args.metrics.name}"}
    # measured bytes need no stored ratio for the encoding they were measured with
    measured = args.no_network or args.bytes_per_sample is not None or bool(profiled_bytes)
    wire = wire_encoding(args.wire, bytes_measured=measured)
    if args.no_network:
        return {"bytes": None, "source": "", "wire": wire, "flow_gbps": flow}
    if args.bytes_per_sample is not None:
        if not args.bytes_per_sample > 0:
            raise NetworkError(f"--bytes-per-sample={args.bytes_per_sample} must be a positive number of bytes")
        return {"bytes": args.bytes_per_sample, "source": "measured, --bytes-per-sample", "wire": wire,
                "flow_gbps": flow}
    if profiled_bytes:
        return {"bytes": profiled_bytes, "source": "the profiled batches' tensors", "wire": wire, "flow_gbps": flow}
    side = parse_kv(args.option).get("image_size") or args.crop_size  # the image pipeline's crop option
    if not isinstance(side, int) or side < 1:
        raise NetworkError(f"crop size {side!r} (--crop-size or -o image_size) must be a positive number of pixels")
    crop = side * side * 3
    ratio = cast(float, wire.bytes_ratio)  # bytes not measured: wire_encoding gave a stored encoding, with a ratio
    return {"bytes": crop * ratio, "wire": wire, "flow_gbps": flow,
            "source": f"assumed: a {side}x{side}x3 uint8 crop"
                      + (f" x {ratio:g} for {wire.name}" if wire.name != "uint8" else "")
                      + "; give --bytes-per-sample as measured, or --profile"}


def run_sizing(args: argparse.Namespace) -> int:
    """``hetero plan --sizing``: the sizing table (Markdown; ``--json``: its rows too)."""
    from dataclasses import asdict

    from hetero.planning.cost import PriceError, load_prices
    from hetero.planning.network import PLACEMENT_GROUP_FLOW_GBPS, SINGLE_FLOW_GBPS, NetworkError
    from hetero.planning.planner import PlanError
    from hetero.planning.sizing import PER_CORE_IMAGES_S, PER_CORE_SOURCE, format_sizing, sizing

    rate = args.per_core_rate if args.per_core_rate is not None else PER_CORE_IMAGES_S
    source = PER_CORE_SOURCE if args.per_core_rate is None else "given with --per-core-rate"
    flow = PLACEMENT_GROUP_FLOW_GBPS if args.placement_group else SINGLE_FLOW_GBPS
    try:
        if not rate > 0:
            raise PlanError(f"--per-core-rate={rate} must be a positive number of images per second")
        table = load_prices(args.prices)
        types = [t.strip() for t in args.data_types.split(",") if t.strip()] or None
        rows = sizing(table, data_types=types, per_core_images_s=rate, target_wait=args.target_wait,
                      max_count=max(args.max_count, 32), flow_gbps=flow)
    except (PriceError, PlanError, NetworkError) as exc:
        print(f"hetero plan: {exc}", file=sys.stderr)
        return 2
    print(format_sizing(rows, table, rate, args.target_wait, flow, source))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    from hetero.planning.cost import PriceError, load_prices
    from hetero.planning.network import COMPACT, wire_encoding
    from hetero.planning.plan_text import format_plan, network_bound, wire_line
    from hetero.planning.planner import PlanError, plan
    from data_service.errors import ConfigError
    from launcher.log_setup import setup_logging
    from hetero.options import parse_kv

    setup_logging("plan", args.log_level)
    if args.sizing:
        return run_sizing(args)
    try:
        if args.gpu_step_s is None:
            raise PlanError("give --gpu-step-s (the GPU step with the batch already resident), or --sizing")
        table = load_prices(args.prices)
        table.info(args.dnn_instance)
        types = [t.strip() for t in args.data_types.split(",") if t.strip()]
        for t in types:
            table.info(t)
        if args.profile:
            options = parse_kv(args.option)
            if args.batch_size:
                options["batch_size"] = args.batch_size
            if "wire_encoding" in options and args.wire == "uint8":
                args.wire = str(options["wire_encoding"])  # the profiled batches are built with it
            preprocess_s, batch_size, profiled_bytes = _profile(args, options)
        else:
            if args.preprocess_s is None or args.batch_size is None:
                raise PlanError("give --preprocess-s and --batch-size (measured figures), or --profile to measure them")
            preprocess_s, batch_size, profiled_bytes = args.preprocess_s, args.batch_size, None
        net = network_inputs(args, profiled_bytes)
        if args.compare and not args.profile:
            raise PlanError("--compare needs --profile (it profiles the pipeline with the option changed)")

        def plan_for(preprocess_s: float, batch_size: int, bytes_per_sample: float | None = None, encode_s: float = 0.0,
                     wire: str = args.wire):
            return plan(table, args.dnn_instance, preprocess_s, args.gpu_step_s, batch_size, dnn_count=args.dnn_count,
                        data_types=types or None, max_count=args.max_count, target_wait=args.target_wait,
                        reserve_cpus=args.reserve_cpus, efficiency=args.efficiency, local_server=args.local_server,
                        epoch_samples=args.epoch_samples, encode_s=encode_s, goodput=args.goodput, wire=wire,
                        bytes_per_sample=bytes_per_sample if bytes_per_sample is not None else net["bytes"],
                        flow_gbps=net["flow_gbps"])
        result = plan_for(preprocess_s, batch_size)
        result.workload["bytes_source"] = net["source"]
        result.workload["prices_sources"] = table.sources_line(
            {args.dnn_instance, *(c.data_instance for c in result.candidates if c.data_instance)})
        wires = []
        # with no stored ratio for the job's encoding there is nothing to scale its measured bytes by
        if net["bytes"] is not None and net["wire"].bytes_ratio is not None and network_bound(result):
            for enc in (e for e in map(wire_encoding, ("up-zstd", COMPACT))
                        if e.bytes_ratio < net["wire"].bytes_ratio):
                ratio = enc.bytes_ratio / net["wire"].bytes_ratio
                wires.append((enc, ratio, plan_for(preprocess_s, batch_size, net["bytes"] * ratio,
                                                   max(0.0, enc.encode_s - net["wire"].encode_s), enc.name)))
        compared = []
        for kv in args.compare:
            changed = {**options, **parse_kv([kv])}
            other_s, other_batch, _ = _profile(args, changed, f" with {kv}")
            compared.append((kv, other_s, plan_for(other_s, other_batch)))
    except (PriceError, PlanError, ConfigError, ValueError) as exc:
        print(f"hetero plan: {exc}", file=sys.stderr)
        return 2
    print(format_plan(result))
    for enc, ratio, other in wires:  # stored encodings, each with a bytes ratio
        print(wire_line(enc.name, cast(float, enc.bytes_ratio), enc.encode_s, enc.source.split("; ")[-1], other,
                        result, enc.decode_s))
    for kv, other_s, other in compared:
        print(compare_line(kv, preprocess_s, result, other_s, other))
    if args.jobs != 1:
        from hetero.planning.sweep_cost import format_sweep, sweep_prices

        try:
            print("\n" + format_sweep(sweep_prices(table, result, args.jobs), args.jobs))
        except PlanError as exc:
            print(f"hetero plan: --jobs {args.jobs}: {exc}", file=sys.stderr)
            return 2
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        print(f"plan: {args.json}")
    return 0 if result.recommended else 1
