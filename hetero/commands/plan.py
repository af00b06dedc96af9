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
from dataclasses import fields
from pathlib import Path


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def register(sub) -> None:
    from hetero.commands import add_command, plain

    p = add_command(sub, "plan", "recommend a data group (instance type and count) and its $/step",
                    plain(__doc__.split("\n\n")[1].replace("\n", " ")))
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
    p.add_argument("--data-types", type=_names, default=(), help="comma-separated CPU instance types (default: all without GPUs)")
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


def run(args: argparse.Namespace) -> int:
    from hetero.planning.plan_run import PlanRequest, run_plan
    from launcher.log_setup import setup_logging

    setup_logging("plan", args.log_level)
    given = {f.name: getattr(args, f.name) for f in fields(PlanRequest)}
    return run_plan(PlanRequest(**{**given, "option": tuple(args.option), "compare": tuple(args.compare)}))
