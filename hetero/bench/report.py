"""Output of the step-time benchmark: a Markdown table, a JSON file, a PNG chart.

Every function takes the summary dict that ``hetero.bench.step_time.run_benchmark`` returns.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from launcher.metric_lines import fmt as _f

from .records import MODES

log = logging.getLogger(__name__)


def step_label(summary: dict) -> str:
    """'emulated accelerator step (50 ms sleep)' or 'real CPU step'."""
    step = summary["config"]["emulate_step_s"]
    return f"EMULATED accelerator step ({step * 1000:g} ms sleep, no GPU)" if step > 0 else "real step on the CPU"


def step_note(step: dict) -> str:
    """Which emulated step the runs use and why, from ``step_time.choose_step``'s dict, e.g.
    'emulated step 12.3 ms: 1/3 of one core's batch (36.9 ms, profiled now), so ...; pass
    --emulate-step-s to set it'."""
    from fractions import Fraction

    if step["source"] == "profiled":
        share = Fraction(step["share"]).limit_denominator(20)
        return (f"emulated step {step['s'] * 1000:.1f} ms: {share} of one core's batch "
                f"({step['batch_s'] * 1000:.1f} ms, profiled now), so the trainer's own core cannot keep up with it; "
                "pass --emulate-step-s to set it")
    if step["s"] > 0:
        return f"emulated step {step['s'] * 1000:g} ms (--emulate-step-s)"
    return "real CPU step, none emulated (--emulate-step-s 0)"


def layout(summary: dict, mode: str) -> str:
    """E.g. '1 x ml.p3.2xlarge (CPUs 0) + 1 x ml.c5.9xlarge (CPUs 1)'."""
    c = summary["config"]
    text = f"1 x {c['dnn_instance']} (CPUs {','.join(map(str, c['trainer_cpus']))})"
    if mode == "heterogeneous":
        text += f" + {c['data_nodes']} x {c['data_instance']} (CPUs {','.join(map(str, c['data_cpus']))})"
    return text


def _rounds(summary: dict) -> str:
    quiet, total = summary["quiet_rounds"], len(summary["rounds"])
    if summary["basis"] == "all rounds":
        return f"{total} round(s), none quiet"
    return f"{len(quiet)} of {total} round(s) quiet: no more than {summary['max_foreign']:.0%} of the cores used by others"


def cpu_line(summary: dict) -> str:
    """CPU per step of the whole job in each mode (steady state), by role, and their ratio."""
    parts = []
    for mode in MODES:
        cps = summary["modes"][mode].get("cpu_per_step_s") or {}
        if not cps.get("total"):
            parts.append(f"{mode} n/a")
            continue
        roles = " + ".join(f"{role} {sec * 1000:.1f}" for role, sec in sorted(cps["by_role"].items()))
        parts.append(f"{mode} {cps['total'] * 1000:.1f} ms ({roles})")
    return (f"**CPU per batch** (every node's CPU per step, steady state, medians): {'; '.join(parts)}; "
            f"heterogeneous / homogeneous {_f(summary.get('cpu_per_step_ratio'), '.2f')}x.")


def markdown(summary: dict) -> str:
    """The benchmark's figures as Markdown (a header, a table, speed-up, cost ratio, prediction)."""
    c, modes = summary["config"], summary["modes"]
    steps_per_epoch = modes["homogeneous"]["cost"]["steps_per_epoch"]
    warm = modes["homogeneous"]["warmup_steps_discarded"]
    lines = [
        f"## Step time and cost: homogeneous vs heterogeneous ({step_label(summary)})", "",
        (f"JPEG image-folder pipeline (decode, RandomResizedCrop(224), flip), batch {c['batch_size']}; "
         if c.get("workload") == "images" else
         f"MNIST pipeline, batch {c['batch_size']}, augment_repeats {c['augment_repeats']}; ") +
        f"{c['repeats']} round(s) "
        f"of both modes (alternating order), {c['steps']} steps per run, first {warm} discarded; "
        f"{'the trainer CPUs also build batches in heterogeneous mode' if c['local_server'] else 'trainer CPUs only train in heterogeneous mode'}. "
        f"Medians over {summary['basis']} ({_rounds(summary)}); spread = min-max of the runs' averages; "
        f"others' CPU = share of the run's cores used by other processes. Prices "
        f"{summary['prices']['region']} on-demand as of {summary['prices']['as_of']}."
        + (f" The {step_note(summary['emulated_step'])}." if summary.get("emulated_step") else ""), "",
        f"| mode | emulated nodes as instances | step time (s) | spread (s) | data wait | samples/s "
        f"| CPU busy per node | others' CPU | $/step | $/1000 steps | $/epoch ({steps_per_epoch} steps) |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in MODES:
        m = modes[mode]
        st, cost = m["step_time_s"], m["cost"]
        busy = "; ".join(f"{k}: {v:.0%}" for k, v in m["cpu_busy_share"].items()) or "n/a"
        lines.append(
            f"| {mode} | {layout(summary, mode)} | {_f(st['median'], '.4f')} | "
            f"{_f(st['min'], '.4f')}-{_f(st['max'], '.4f')} ({st['n']} runs) | "
            f"{_f(m['data_wait_fraction']['median'], '.0%')} | {_f(m['samples_per_s']['median'], '.0f')} | {busy} | "
            f"{_f(m['foreign_share']['median'], '.0%')} | "
            f"{_f(cost.get('usd_per_step'), '.7f')} | {_f(cost.get('usd_per_1000_steps'), '.4f')} | "
            f"{_f(cost.get('usd_per_epoch'), '.4f')} |")
    rounds = ", ".join(f"{r:.2f}" for r in summary["speedup_per_round"])
    lines += ["", f"**Speed-up** (homogeneous / heterogeneous step time, medians): "
              f"{_f(summary['speedup'], '.2f')}x; per round: {rounds or 'n/a'} "
              f"(median {_f(summary['speedup_per_round_median'], '.2f')}x).",
              f"**Cost ratio** per step (homogeneous / heterogeneous, "
              f"${modes['homogeneous']['cost']['usd_per_hour']:.3f}/h vs "
              f"${modes['heterogeneous']['cost']['usd_per_hour']:.3f}/h): {_f(summary['cost_ratio'], '.2f')}x.",
              cpu_line(summary)]
    if summary["basis"] != "all rounds":
        allm = summary["modes_all_rounds"]
        lines.append(f"All {len(summary['rounds'])} rounds, quiet or not: homogeneous "
                     f"{_f(allm['homogeneous']['step_time_s']['median'], '.4f')} s, heterogeneous "
                     f"{_f(allm['heterogeneous']['step_time_s']['median'], '.4f')} s, speed-up "
                     f"{_f(summary['all_rounds_speedup'], '.2f')}x; per round: "
                     + (", ".join(f"{r:.2f}" for r in summary["all_rounds_speedup_per_round"]) or "n/a") + ".")
    else:
        lines.append(f"No round was quiet (others used more than {summary['max_foreign']:.0%} of the cores): "
                     "these figures include other processes' load, which falls on the heterogeneous run's cores.")
    pred, prof = summary.get("prediction", {}), summary.get("profile")
    if prof:
        others = [p["median_s"] for p in summary.get("profiles", []) if p is not prof and p != prof]
        lines.append(f"Profile: {prof['median_s'] * 1000:.1f} ms per batch on one core (CPU {prof['cpu']}, median of "
                     f"{len(prof['times_s']) - prof['warmup_batches']}, {prof['min_s'] * 1000:.1f}-"
                     f"{prof['max_s'] * 1000:.1f} ms)"
                     + (f"; the other profile (before/after the runs) gave "
                        f"{', '.join(f'{o * 1000:.1f}' for o in others)} ms." if others else "."))
    if "homogeneous" in pred:
        parts = [f"{mode} {pred[mode]['step_s']:.4f} s predicted ({_f(pred[mode].get('cores_had'), '.2f')} of "
                 f"{pred[mode]['cores']} pinned core(s) had, data wait {pred[mode]['data_wait_fraction']:.0%}; "
                 f"{_f(pred[mode].get('pinned_step_s'), '.4f')} s on whole cores) vs "
                 f"{_f(pred[mode]['measured_step_s'], '.4f')} s measured "
                 f"({_f(pred[mode]['measured_over_predicted'], '.2f')}x)"
                 for mode in MODES]
        own = [f"finish stage {pred['trainer_s_per_batch'] * 1000:.1f} ms of CPU"] if pred.get("trainer_s_per_batch") else []
        if pred.get("preprocess_cpu_s_per_batch"):
            lines.append(f"CPU per batch built: {pred['preprocess_cpu_s_per_batch'] * 1000:.1f} ms with the other cores "
                         f"idle, {pred.get('preprocess_cpu_s_per_batch_cores_busy', 0.0) * 1000:.1f} ms with the "
                         "trainer's cores busy (profiles before and after the runs).")
        if pred.get("loader_handoff_s_per_batch"):
            own.append(f"loader hand-off {pred['loader_handoff_s_per_batch'] * 1000:.1f} ms")
        lines.append("Planner: " + "; ".join(parts) + "."
                     + (f" The trainer's own CPU per batch counted: {', '.join(own)}." if own else ""))
    elif pred:
        lines.append(f"Planner: no prediction ({pred.get('note')}).")
    net = network_line(summary.get("network"))
    if net:
        lines.append(net)
    return "\n".join(lines)


def network_line(net: dict | None) -> str:
    """Bytes per sample on the wire, the Gbps moved here and the network's verdict on the priced instances."""
    if not net or not net.get("bytes_per_sample"):
        return ""
    line = f"Network: {net['bytes_per_sample']:,.0f} bytes per sample ({net['bytes_source']})"
    if net.get("heterogeneous_gbps_here"):
        line += f"; the heterogeneous runs moved {net['heterogeneous_gbps_here']:.2f} Gbps here"
    aws = net.get("aws") or {}
    if "binding" in aws:
        line += (f". On AWS at the emulated step this job needs {aws['demand_gbps']:.2f} Gbps per GPU; "
                 f"{aws['data_nodes']} x {aws['data_instance']} ({aws['data_baseline_gbps']:g} Gbps baseline) "
                 f"feeding {aws['dnn_instance']} ({aws['dnn_baseline_gbps']:g} Gbps): predicted "
                 f"{aws['step_s']:.4f} s/step, bound by {aws['binding']}")
    elif aws.get("note"):
        line += f"; no AWS projection ({aws['note']})"
    return line + "."


def write_json(path: Path, summary: dict) -> None:
    """Every figure, as JSON (written atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def write_png(path: Path, summary: dict) -> None:
    """Two panels: step time per mode (bar = median, whisker = min-max, x = prediction) and $/1000 steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = summary["modes"]
    names = list(MODES)
    colors = ["#8c8c8c", "#2a7ab0"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.6))
    steps = [modes[m]["step_time_s"]["median"] or 0.0 for m in names]
    lo = [s - (modes[m]["step_time_s"]["min"] or s) for s, m in zip(steps, names)]
    hi = [(modes[m]["step_time_s"]["max"] or s) - s for s, m in zip(steps, names)]
    ax1.bar(names, steps, color=colors, yerr=[lo, hi], capsize=6)
    for i, s in enumerate(steps):
        ax1.annotate(f"{s:.3f} s", (i, s), xytext=(10, 4), textcoords="offset points", ha="left", fontsize=10)
    pred = summary.get("prediction", {})
    if "homogeneous" in pred:
        ax1.scatter(range(len(names)), [pred[m]["step_s"] for m in names], marker="x", color="black", zorder=3,
                    label="planner prediction")
        ax1.legend(loc="upper right", fontsize=9)
    speed = summary.get("speedup")
    ax1.set_title(f"Avg step time (median, min-max){'' if speed is None else f' - speed-up {speed:.2f}x'}",
                  fontsize=11)
    ax1.set_ylabel("seconds per step")
    ax1.set_ylim(0, max(steps + [s + h for s, h in zip(steps, hi)]) * 1.25 or 1)
    costs = [modes[m]["cost"].get("usd_per_1000_steps") or 0.0 for m in names]
    ax2.bar(names, costs, color=colors)
    for i, (v, m) in enumerate(zip(costs, names)):
        ax2.annotate(f"${v:.4f}\n${modes[m]['cost']['usd_per_hour']:.3f}/h", (i, v), xytext=(0, 4),
                     textcoords="offset points", ha="center", fontsize=9)
    ratio = summary.get("cost_ratio")
    ax2.set_title(f"$ per 1000 steps{'' if ratio is None else f' - cost ratio {ratio:.2f}x'}", fontsize=11)
    ax2.set_ylabel("US$ (on-demand, " + summary["prices"]["as_of"] + ")")
    ax2.set_ylim(0, max(costs) * 1.35 or 1)
    c = summary["config"]
    fig.suptitle(f"{step_label(summary)}; trainer = {c['dnn_instance']} on CPUs "
                 f"{','.join(map(str, c['trainer_cpus']))}, data = {c['data_nodes']} x {c['data_instance']} "
                 f"on CPUs {','.join(map(str, c['data_cpus']))}\nmedians over {_rounds(summary)}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log.info("chart written to %s", path)
