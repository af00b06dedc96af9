"""A plan as text: the inputs, one row per layout, the recommendation, and what another wire encoding
or a changed pipeline option gives.

Used by ``hetero plan`` (``hetero/planning/plan_run.py``); the arithmetic is ``planner.py``'s.
"""
from __future__ import annotations

from launcher.capacity import Binding

from .network import WireEncoding
from .planner import Plan


def _network_line(p: Plan) -> str:
    w, lay = p.workload, p.layouts
    if w.bytes_per_sample is None:
        return "Network: not modelled (no bytes per sample given): the plan counts cores only."
    flow = "not limited" if w.flow_gbps is None else f"{w.flow_gbps:g} Gbps per flow"
    base, burst = lay.dnn.baseline_gbps, lay.dnn.burst_gbps
    dnn = ("unknown" if base is None else
           f"{base:g} Gbps baseline" + ("" if (burst or 0) <= base else f" (burst {burst:g}, minutes on credits)"))
    return (f"Network: {w.bytes_per_sample:,.0f} bytes per sample on the wire ("
            f"{'wire ' + w.wire + '; ' if w.wire else ''}{w.bytes_source or 'given'}); "
            "a step with no data wait needs "
            f"{lay.demand_gbps:.2f} Gbps into the DNN node(s); each {w.dnn_instance}: {dnn}; {flow}.")


def format_plan(p: Plan) -> str:
    """The plan as Markdown: inputs, one row per option, the recommendation."""
    w, lay = p.workload, p.layouts
    types = {w.dnn_instance, *(c.data_instance for c in p.candidates if c.data_instance)}
    lines = [f"Workload: {lay.consumers} accelerator(s) on {w.dnn_count} x {w.dnn_instance}, "
             f"batch {w.batch_size}, preprocessing {w.preprocess_s * 1000:.1f} ms/batch on one core, "
             f"GPU step {w.gpu_step_s * 1000:.1f} ms with resident data; target data wait "
             f"<= {w.target_wait:.0%}; prices {lay.table.region} as of {lay.table.as_of}.",
             lay.table.sources_line(types), _network_line(p), "",
             "| layout | data cores | pred. step (s) | data wait | binds | Gbps per data node | $/h | $/step | "
             "$/1000 images | $/epoch | meets target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in (p.homogeneous, *p.candidates):
        epoch = "n/a" if o.usd_per_epoch is None else f"{o.usd_per_epoch:.4f}"
        gbps = "-" if o.gbps_per_data_node is None else f"{o.gbps_per_data_node:.2f}"
        mark = " (recommended)" if o is p.recommended else ""
        lines.append(f"| {o.label}{mark} | {o.cores:g} | {o.step_s:.4f} | {o.data_wait_fraction:.1%} | {o.binding} | "
                     f"{gbps} | {o.usd_per_hour:.3f} | {o.usd_per_step:.6f} | {o.usd_per_1000_images:.6f} | {epoch} | "
                     f"{'yes' if o.meets_target else 'no'} |")
    lines.append("")
    if p.recommended is None:
        lines.append(_none_meets(p))
    elif p.recommended.data_instance is None:
        lines.append(_homogeneous_words(p))
    else:
        r, h = p.recommended, p.homogeneous
        lines.append(f"Recommended: {r.data_count} x {r.data_instance} beside {w.dnn_count} x "
                     f"{w.dnn_instance}: predicted {r.step_s:.4f} s/step ({r.data_wait_fraction:.1%} data wait, "
                     f"bound by {r.binding}), ${r.usd_per_step:.6f}/step, ${r.usd_per_1000_images:.6f}/1000 images; "
                     f"homogeneous {h.step_s:.4f} s/step, ${h.usd_per_step:.6f}/step "
                     f"(cost ratio homogeneous/recommended {h.usd_per_step / r.usd_per_step:.2f}).")
    return "\n".join(lines)


def _none_meets(p: Plan) -> str:
    w = p.workload
    head = (f"Neither the GPU instance(s) alone nor a data group of at most {w.max_count} instances keeps data "
            f"wait under {w.target_wait:.0%}")
    best = min(p.candidates, key=lambda c: c.step_s, default=None)
    if best is not None and best.binding.network:
        return (f"{head}: the network binds, {_binding_words(best.binding, p)}. Send fewer bytes per sample "
                "(a compact --wire encoding), or choose instances with more bandwidth (network-optimised "
                "types such as c5n, a larger DNN instance, a cluster placement group for the flow cap).")
    return f"{head}; raise --max-count, relax --target-wait or make preprocessing cheaper."


def _homogeneous_words(p: Plan) -> str:
    w, h, group = p.workload, p.homogeneous, p.data_group
    line = (f"Recommended: no data group: the {w.dnn_count} x {w.dnn_instance} alone, its own vCPUs building "
            f"the batches and nothing crossing a NIC: predicted {h.step_s:.4f} s/step ({h.data_wait_fraction:.1%} "
            f"data wait, bound by {h.binding}), ${h.usd_per_step:.6f}/step, ${h.usd_per_1000_images:.6f}/1000 images")
    if group is None:
        return line + "; no data group meets the target."
    return (line + f"; a data group does not pay for this workload: the cheapest that meets the target, "
            f"{group.label}, costs {group.usd_per_1000_images / h.usd_per_1000_images:.2f}x as much per 1,000 images.")


def _binding_words(binding: Binding, p: Plan) -> str:
    if binding is Binding.DNN_NIC:
        return (f"the {p.workload.dnn_instance} NIC ({p.layouts.dnn.baseline_gbps:g} Gbps baseline) carries less "
                f"than the {p.layouts.demand_gbps:.2f} Gbps the GPUs take")
    if binding is Binding.FLOW:
        return f"one flow per rank and data node carries at most {p.workload.flow_gbps:g} Gbps"
    return "the data nodes' NIC baselines carry less than their cores build"


def network_bound(p: Plan) -> bool:
    """True when the network sets the recommended layout's step, or keeps every layout from the target."""
    if p.recommended is not None:
        return p.recommended.binding.network
    return any(c.binding.network for c in p.candidates)


def wire_line(enc: WireEncoding, other: Plan, current: Plan) -> str:
    """One line: what the plan becomes with the wire encoding ``enc`` instead (``other``: the plan with
    it; ``current``: the plan as given)."""
    r, now = other.recommended, current.recommended
    note = enc.source.split("; ")[-1]  # what the source says of its quality
    dnn_cores = enc.decode_s * other.layouts.images_per_step / (r.step_s if r else other.workload.gpu_step_s)
    head = (f"with --wire {enc.name} ({enc.bytes_ratio:.3f} of uint8's bytes, +{enc.encode_s * 1000:.2f} ms data-node "
            f"CPU per sample{'; ' + note if note else ''}; decoding takes ~{dnn_cores:.1f} DNN-node cores on the CPU, "
            "little with a GPU decoder): ")
    if r is None:
        best = min(other.candidates, key=lambda c: c.step_s, default=None)
        return head + ("still no data group meets the target" +
                       (f" (best {best.label}, {best.step_s:.4f} s/step, bound by {best.binding})" if best else ""))
    layout = "no data group" if r.data_instance is None else f"{r.data_count} x {r.data_instance}"
    line = (head + f"{layout}, predicted {r.step_s:.4f} s/step, bound by {r.binding}, "
            f"${r.usd_per_1000_images:.6f}/1000 images")
    if now is not None:
        line += f" (as given: ${now.usd_per_1000_images:.6f})"
    return line


def compare_line(kv: str, preprocess_s: float, result: Plan, other_s: float, other: Plan) -> str:
    """One line: the data group the pipeline needs as given against with ``kv``, and the $/h between."""
    def group(p: Plan) -> str:
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


__all__ = ["compare_line", "format_plan", "network_bound", "wire_line"]
