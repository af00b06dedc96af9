"""A plan as text: the inputs, one row per layout, the recommendation, and what another wire encoding gives.

Used by ``hetero plan`` (``hetero/commands/plan.py``); the arithmetic is ``planner.py``'s.
"""
from __future__ import annotations

from .network import NETWORK_BINDINGS
from .planner import Plan


def _network_line(w: dict) -> str:
    if w.get("bytes_per_sample") is None:
        return "Network: not modelled (no bytes per sample given): the plan counts cores only."
    flow = "not limited" if w["flow_gbps"] is None else f"{w['flow_gbps']:g} Gbps per flow"
    dnn = ("unknown" if w["dnn_baseline_gbps"] is None else
           f"{w['dnn_baseline_gbps']:g} Gbps baseline" + (
               "" if (w.get("dnn_burst_gbps") or 0) <= w["dnn_baseline_gbps"]
               else f" (burst {w['dnn_burst_gbps']:g}, minutes on credits)"))
    return (f"Network: {w['bytes_per_sample']:,.0f} bytes per sample on the wire ("
            f"{'wire ' + w['wire'] + '; ' if w.get('wire') else ''}{w.get('bytes_source') or 'given'}); "
            "a step with no data wait needs "
            f"{w['demand_gbps']:.2f} Gbps into the DNN node(s); each {w['dnn_instance']}: {dnn}; {flow}.")


def format_plan(p: Plan) -> str:
    """The plan as Markdown: inputs, one row per option, the recommendation."""
    w = p.workload
    lines = [f"Workload: {w['consumers']} accelerator(s) on {w['dnn_count']} x {w['dnn_instance']}, "
             f"batch {w['batch_size']}, preprocessing {w['preprocess_s'] * 1000:.1f} ms/batch on one core, "
             f"GPU step {w['gpu_step_s'] * 1000:.1f} ms with resident data; target data wait "
             f"<= {w['target_wait']:.0%}; prices {w['prices_region']} as of {w['prices_as_of']}.",
             *([w["prices_sources"]] if w.get("prices_sources") else []),
             _network_line(w), "",
             "| layout | data cores | pred. step (s) | data wait | binds | Gbps per data node | $/h | $/step | "
             "$/1000 images | $/epoch | meets target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in [p.homogeneous] + p.candidates:
        epoch = "n/a" if o.usd_per_epoch is None else f"{o.usd_per_epoch:.4f}"
        gbps = "-" if o.gbps_per_data_node is None else f"{o.gbps_per_data_node:.2f}"
        mark = " (recommended)" if o is p.recommended else ""
        lines.append(f"| {o.label}{mark} | {o.cores:g} | {o.step_s:.4f} | {o.data_wait_fraction:.1%} | {o.binding} | "
                     f"{gbps} | {o.usd_per_hour:.3f} | {o.usd_per_step:.6f} | {o.usd_per_1000_images:.6f} | {epoch} | "
                     f"{'yes' if o.meets_target else 'no'} |")
    lines.append("")
    if p.recommended is None:
        lines.append(_none_meets(p, w))
    elif p.recommended.data_instance is None:
        lines.append(_homogeneous_words(p, w))
    else:
        r, h = p.recommended, p.homogeneous
        lines.append(f"Recommended: {r.data_count} x {r.data_instance} beside {w['dnn_count']} x "
                     f"{w['dnn_instance']}: predicted {r.step_s:.4f} s/step ({r.data_wait_fraction:.1%} data wait, "
                     f"bound by {r.binding}), ${r.usd_per_step:.6f}/step, ${r.usd_per_1000_images:.6f}/1000 images; "
                     f"homogeneous {h.step_s:.4f} s/step, ${h.usd_per_step:.6f}/step "
                     f"(cost ratio homogeneous/recommended {h.usd_per_step / r.usd_per_step:.2f}).")
    return "\n".join(lines)


def _none_meets(p: Plan, w: dict) -> str:
    head = (f"Neither the GPU instance(s) alone nor a data group of at most {w['max_count']} instances keeps data "
            f"wait under {w['target_wait']:.0%}")
    best = min(p.candidates, key=lambda c: c.step_s, default=None)
    if best is not None and best.binding in NETWORK_BINDINGS:
        return (f"{head}: the network binds, {_binding_words(best.binding, w)}. Send fewer bytes per sample "
                "(a compact --wire encoding), or choose instances with more bandwidth (network-optimised "
                "types such as c5n, a larger DNN instance, a cluster placement group for the flow cap).")
    return f"{head}; raise --max-count, relax --target-wait or make preprocessing cheaper."


def _homogeneous_words(p: Plan, w: dict) -> str:
    h, group = p.homogeneous, p.data_group
    line = (f"Recommended: no data group: the {w['dnn_count']} x {w['dnn_instance']} alone, its own vCPUs building "
            f"the batches and nothing crossing a NIC: predicted {h.step_s:.4f} s/step ({h.data_wait_fraction:.1%} "
            f"data wait, bound by {h.binding}), ${h.usd_per_step:.6f}/step, ${h.usd_per_1000_images:.6f}/1000 images")
    if group is None:
        return line + "; no data group meets the target."
    return (line + f"; a data group does not pay for this workload: the cheapest that meets the target, "
            f"{group.label}, costs {group.usd_per_1000_images / h.usd_per_1000_images:.2f}x as much per 1,000 images.")


def _binding_words(binding: str, w: dict) -> str:
    if binding == "DNN NIC":
        return (f"the {w['dnn_instance']} NIC ({w['dnn_baseline_gbps']:g} Gbps baseline) carries less than the "
                f"{w['demand_gbps']:.2f} Gbps the GPUs take")
    if binding == "flow":
        return f"one flow per rank and data node carries at most {w['flow_gbps']:g} Gbps"
    return "the data nodes' NIC baselines carry less than their cores build"


def network_bound(p: Plan) -> bool:
    """True when the network sets the recommended layout's step, or keeps every layout from the target."""
    if p.recommended is not None:
        return p.recommended.binding in NETWORK_BINDINGS
    return any(c.binding in NETWORK_BINDINGS for c in p.candidates)


def wire_line(name: str, ratio: float, encode_s: float, note: str, other: Plan, current: Plan,
              decode_s: float = 0.0) -> str:
    """One line: what the plan becomes with the wire encoding ``name`` instead.

    Args:
        ratio: its bytes over uint8's. encode_s / decode_s: data-node / DNN-node CPU seconds per sample.
        note: what to say of its quality. other: the plan with it. current: the plan as given.
    """
    r, now = other.recommended, current.recommended
    w = other.workload
    dnn_cores = decode_s * w["consumers"] * w["batch_size"] / (r.step_s if r else w["gpu_step_s"])
    head = (f"with --wire {name} ({ratio:.3f} of uint8's bytes, +{encode_s * 1000:.2f} ms data-node CPU per sample"
            f"{'; ' + note if note else ''}; decoding takes ~{dnn_cores:.1f} DNN-node cores on the CPU, "
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


__all__ = ["format_plan", "network_bound", "wire_line"]
