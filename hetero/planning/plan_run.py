"""``hetero plan``'s body: the request it was given, planned (profiled first if asked), printed.

The plan as given, with the compact wire encodings priced when the network binds, each
``--compare`` option profiled and priced beside it, and a sweep of ``--jobs`` such jobs; or, with
``--sizing``, the sizing table instead (hetero/planning/sizing.py).
"""
from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

from launcher.capacity import PLACEMENT_GROUP_FLOW_GBPS, SINGLE_FLOW_GBPS, PlanError, positive

from .cost import PriceTable, load_prices
from .network import COMPACT, WireBytes, WireEncoding, wire_bytes, wire_encoding
from .plan_text import compare_line, format_plan, network_bound, wire_line
from .planner import Plan, Workload, plan
from .profile import ProfileResult


@dataclass(frozen=True)
class PlanRequest:
    """What ``hetero plan`` was asked, one field per option of the same name (its ``--help`` says
    what each means); ``option`` and ``compare`` are the KEY=VALUE strings as given."""

    dnn_instance: str
    dnn_count: int
    gpu_step_s: float | None
    preprocess_s: float | None
    batch_size: int | None
    profile: bool
    pipeline: str
    option: tuple[str, ...]
    profile_batches: int
    target_wait: float
    data_types: tuple[str, ...]
    max_count: int
    reserve_cpus: int
    efficiency: float
    local_server: bool
    epoch_samples: int
    prices: str | None
    compare: tuple[str, ...]
    bytes_per_sample: float | None
    metrics: Path | None
    crop_size: int
    wire: str
    placement_group: bool
    goodput: float
    no_network: bool
    sizing: bool
    per_core_rate: float | None
    jobs: int
    json: Path | None

    @property
    def flow_gbps(self) -> float:
        """One flow's cap: 10 Gbps inside a cluster placement group, 5 outside."""
        return PLACEMENT_GROUP_FLOW_GBPS if self.placement_group else SINGLE_FLOW_GBPS


def run_plan(r: PlanRequest) -> int:
    """Answer ``r``: print the plan (or the sizing table) and write its JSON.

    Returns:
        The exit code: 0 a recommendation, 1 no layout meets the target (the GPU instances alone
        included), 2 bad input (said on stderr, naming the value and the fix).
    """
    from hetero.options import parse_kv

    try:
        table = load_prices(r.prices)
        if r.sizing:
            return _sizing(r, table)
        options = parse_kv(list(r.option))
        if r.profile and r.batch_size:
            options["batch_size"] = r.batch_size
        result, on_wire = _plan(r, table, options)
        wires = _wires(table, result, on_wire)
        compared = []
        for kv in r.compare:
            prof = _profile(r, {**options, **parse_kv([kv])}, f" with {kv}")
            compared.append((kv, prof.median_s, plan(table, replace(result.workload, preprocess_s=prof.median_s,
                                                                    batch_size=prof.batch_size))))
        sweep = _sweep(result, r.jobs) if r.jobs != 1 else ""
    except ValueError as exc:  # a PlanError, a ConfigError of an option, a profile that cannot run
        print(f"hetero plan: {exc}", file=sys.stderr)
        return 2
    print(format_plan(result))
    for enc, with_enc in wires:
        print(wire_line(enc, with_enc, result))
    for kv, other_s, other in compared:
        print(compare_line(kv, result.workload.preprocess_s, result, other_s, other))
    if sweep:
        print("\n" + sweep)
    if r.json:
        _write_json(r.json, result.to_dict())
        print(f"plan: {r.json}")
    return 0 if result.recommended else 1


def _plan(r: PlanRequest, table: PriceTable, options: dict[str, Any]) -> tuple[Plan, WireBytes]:
    """The plan as given (profiling the pipeline first with ``--profile``), and what a sample takes on the
    wire."""
    if r.gpu_step_s is None:
        raise PlanError("give --gpu-step-s (the GPU step with the batch already resident), or --sizing")
    if r.compare and not r.profile:
        raise PlanError("--compare needs --profile (it profiles the pipeline with the option changed)")
    for t in (r.dnn_instance, *r.data_types):
        table.info(t)  # an unknown type is said before a profile takes its seconds
    wire, profiled = r.wire, None
    if r.profile:
        if "wire_encoding" in options and wire == "uint8":
            wire = str(options["wire_encoding"])  # the profiled batches are built with it
        prof = _profile(r, options)
        preprocess_s, batch_size, profiled = prof.median_s, prof.batch_size, prof.bytes_per_sample
    elif r.preprocess_s is None or r.batch_size is None:
        raise PlanError("give --preprocess-s and --batch-size (measured figures), or --profile to measure them")
    else:
        preprocess_s, batch_size = r.preprocess_s, r.batch_size
    on_wire = wire_bytes(wire, modelled=not r.no_network, metrics=r.metrics, batch_size=r.batch_size,
                         given=r.bytes_per_sample, profiled=profiled,
                         crop_side=options.get("image_size") or r.crop_size)  # the image pipeline's crop option
    workload = Workload(r.dnn_instance, preprocess_s, r.gpu_step_s, batch_size, r.dnn_count, r.data_types,
                        r.max_count, r.target_wait, r.reserve_cpus, r.efficiency, r.local_server, r.epoch_samples,
                        on_wire.bytes_per_sample, 0.0, r.flow_gbps, r.goodput, on_wire.wire.name, on_wire.source)
    return plan(table, workload), on_wire


def _wires(table: PriceTable, result: Plan, on_wire: WireBytes) -> list[tuple[WireEncoding, Plan]]:
    """The plan again with each stored encoding more compact than the job's, when the network binds."""
    now, per_sample = on_wire.wire, on_wire.bytes_per_sample
    # with no stored ratio for the job's encoding there is nothing to scale its measured bytes by
    if per_sample is None or now.bytes_ratio is None or not network_bound(result):
        return []
    out = []
    for enc in (wire_encoding("up-zstd"), wire_encoding(COMPACT)):
        ratio = cast(float, enc.bytes_ratio) / now.bytes_ratio  # a stored encoding: it has a ratio
        if ratio < 1:
            out.append((enc, plan(table, replace(result.workload, bytes_per_sample=per_sample * ratio, wire=enc.name,
                                                 encode_s=max(0.0, enc.encode_s - now.encode_s)))))
    return out


def _sweep(result: Plan, jobs: int) -> str:
    from .sweep_cost import format_sweep, sweep_prices

    try:
        return format_sweep(sweep_prices(result, jobs), jobs)
    except PlanError as exc:
        raise PlanError(f"--jobs {jobs}: {exc}") from None


def _profile(r: PlanRequest, options: dict[str, Any], label: str = "") -> ProfileResult:
    """The pipeline profiled on one core (on synthetic MNIST when the default pipeline has no data)."""
    import os

    from .profile import profile_pipeline

    with contextlib.ExitStack() as stack:
        if (r.pipeline == "examples.mnist:build_pipeline" and "data_dir" not in options
                and not os.environ.get("SM_CHANNEL_TRAINING")):
            from hetero.synthetic.mnist import write_synthetic

            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="hetero-plan-"))
            write_synthetic(tmp, 2048, 0)
            options = {**options, "data_dir": tmp}
            print("profiling on synthetic MNIST (no data_dir option, no SM_CHANNEL_TRAINING)")
        prof = profile_pipeline(r.pipeline, options, batches=r.profile_batches)
    print(f"profile{label}: {prof.median_s * 1000:.1f} ms per batch of {prof.batch_size} on CPU {prof.cpu} "
          f"(median of {r.profile_batches}; {prof.min_s * 1000:.1f}-{prof.max_s * 1000:.1f} ms), "
          f"{prof.bytes_per_sample:,.0f} bytes per sample built")
    return prof


def _sizing(r: PlanRequest, table: PriceTable) -> int:
    """``hetero plan --sizing``: the sizing table (Markdown; ``--json``: its rows too)."""
    from .sizing import PER_CORE_IMAGES_S, PER_CORE_SOURCE, format_sizing, sizing

    given = r.per_core_rate
    rate = PER_CORE_IMAGES_S if given is None else positive("--per-core-rate", given,
                                                            fix="give the images one vCPU decodes per second")
    rows = sizing(table, data_types=r.data_types, per_core_images_s=rate, target_wait=r.target_wait,
                  max_count=max(r.max_count, 32), flow_gbps=r.flow_gbps)
    print(format_sizing(rows, table, rate, r.target_wait, r.flow_gbps,
                        PER_CORE_SOURCE if given is None else "given with --per-core-rate"))
    if r.json:
        _write_json(r.json, [asdict(row) for row in rows])
    return 0


def _write_json(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


__all__ = ["PlanRequest", "run_plan"]
