"""Figures of the step-time benchmark: medians, spreads, speed-up, costs, the planner's prediction.

A *round* runs both modes back to back. A round is *quiet* when, during each of its runs,
other processes (other users' jobs on a shared machine) used at most ``max_foreign`` of the
run's pinned cores. Heterogeneous runs occupy every core, so a neighbour's load lands on
them, while a homogeneous run leaves the data cores free for it: contended rounds are biased
against the heterogeneous layout. The headline figures therefore come from the quiet rounds
when there is at least one (``basis`` says which); the figures of all rounds are kept too.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any, cast

from launcher.capacity import items_to_gbps
from launcher.metric_lines import JobMetrics

from ..planning.network import SINGLE_FLOW_GBPS, bytes_per_image_from_stats
from ..planning.planner import predict_fed_step, predict_network_step

from .cpu_monitor import cpu_list_text, foreign_share
from .records import MODES, BenchConfig, RunResult


def spread(values: list[float]) -> dict:
    """Median, min, max and count of ``values`` (None figures when empty)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def quiet_rounds(runs: list[RunResult], max_foreign: float) -> list[int]:
    """Rounds whose every run succeeded with at most ``max_foreign`` of its cores used by others."""
    rounds: dict[int, list] = {}
    for r in runs:
        rounds.setdefault(r.round, []).append(r)
    return sorted(n for n, rs in rounds.items()
                  if {r.mode for r in rs} == set(MODES)
                  and all(r.ok and r.foreign_share is not None and r.foreign_share <= max_foreign for r in rs))


def mode_figures(runs: list[RunResult], mode: str, warmup: int) -> dict:
    """Step time, data wait, samples/s (median and spread) and CPU busy share per node of ``mode``."""
    good = [r for r in runs if r.mode == mode and r.ok and r.step_s is not None]
    # a run with a step time has metrics: step_s is read from them
    metrics = [cast(JobMetrics, r.figures) for r in good]
    busy: dict[str, list[float]] = {}
    for r in good:
        for node in r.cpu:
            label = f"{node['role']} {node['host']} (CPUs {cpu_list_text(node['cpus'])})"
            busy.setdefault(label, []).append(node["busy_share"])
    return {
        "runs": len(good), "failed_runs": sum(1 for r in runs if r.mode == mode and not r.ok),
        "step_time_s": spread([cast(float, r.step_s) for r in good]),
        "step_time_windows_s": spread([w for r in good for w in r.windows_s]),
        "data_wait_fraction": spread([cast(float, m.data_wait_fraction) for m in metrics]),
        "samples_per_s": spread([cast(float, m.samples_per_s) for m in metrics]),
        "cpu_busy_share": {k: statistics.median(v) for k, v in busy.items()},
        "foreign_share": spread([r.foreign_share for r in good if r.foreign_share is not None]),
        "warmup_steps_discarded": metrics[0].warmup_steps_discarded if good else warmup,
        "steps_per_run": metrics[0].steps if good else 0,
        "step_kind": metrics[0].step_kind if good else None,
        "cpu_per_step_s": cpu_per_step(good),
    }


def cpu_per_step(runs: list[RunResult]) -> dict:
    """Steady-state CPU seconds per step: median over runs of each role's nodes summed, and the total."""
    by_role: dict[str, list[float]] = {}
    totals = []
    for r in runs:
        if not r.cpu_per_step_s:
            continue
        roles: dict[str, float] = {}
        for label, sec in r.cpu_per_step_s.items():
            role = label.split(" ")[0]
            roles[role] = roles.get(role, 0.0) + sec
        for role, sec in roles.items():
            by_role.setdefault(role, []).append(sec)
        totals.append(sum(roles.values()))
    return {"total": statistics.median(totals) if totals else None,
            "by_role": {k: statistics.median(v) for k, v in by_role.items()}}


def speedups(runs: list[RunResult]) -> list[float]:
    """Homogeneous / heterogeneous step time of each round where both runs succeeded."""
    pairs: dict[int, dict] = {}
    for r in runs:
        pairs.setdefault(r.round, {})[r.mode] = r.step_s if r.ok else None
    return [p["homogeneous"] / p["heterogeneous"] for _, p in sorted(pairs.items())
            if p.get("homogeneous") and p.get("heterogeneous")]


def summarize(cfg: BenchConfig, runs: list[RunResult]) -> dict:
    """Per mode figures over the quiet rounds (or all rounds if none is quiet), and the speed-up."""
    quiet = quiet_rounds(runs, cfg.max_foreign)
    basis_runs = [r for r in runs if r.round in quiet] if quiet else runs
    out: dict[str, Any] = {"basis": "quiet rounds" if quiet else "all rounds", "quiet_rounds": quiet,
                           "rounds": sorted({r.round for r in runs}), "max_foreign": cfg.max_foreign}
    for prefix, subset, key in (("", basis_runs, "modes"), ("all_rounds_", runs, "modes_all_rounds")):
        out[key] = {mode: mode_figures(subset, mode, cfg.warmup) for mode in MODES}
        ratios = speedups(subset)
        homo = out[key]["homogeneous"]["step_time_s"]["median"]
        het = out[key]["heterogeneous"]["step_time_s"]["median"]
        out[f"{prefix}speedup"] = homo / het if homo and het else None
        out[f"{prefix}speedup_per_round"] = ratios
        out[f"{prefix}speedup_per_round_median"] = statistics.median(ratios) if ratios else None
    homo_cpu = out["modes"]["homogeneous"]["cpu_per_step_s"]["total"]
    het_cpu = out["modes"]["heterogeneous"]["cpu_per_step_s"]["total"]
    out["cpu_per_step_ratio"] = het_cpu / homo_cpu if homo_cpu and het_cpu else None
    return out


def add_costs(cfg: BenchConfig, summary: dict, table) -> None:
    """$/step, $/1000 steps, $/epoch per mode and the cost ratio (homogeneous / heterogeneous)."""
    clusters = {"homogeneous": [(cfg.dnn_instance, 1)],
                "heterogeneous": [(cfg.dnn_instance, 1), (cfg.data_instance, cfg.data_nodes)]}
    steps_per_epoch = max(1, cfg.epoch_samples // cfg.batch_size)
    per_step = {}
    for mode, cluster in clusters.items():
        step = summary["modes"][mode]["step_time_s"]["median"]
        entry = {"cluster": [list(c) for c in cluster], "usd_per_hour": table.cluster_hourly(cluster),
                 "steps_per_epoch": steps_per_epoch}
        if step:
            per_step[mode] = table.cost_per_step(cluster, step)
            entry.update(usd_per_step=per_step[mode], usd_per_1000_steps=table.cost_per_1000_steps(cluster, step),
                         usd_per_epoch=table.cost_per_epoch(cluster, step, steps_per_epoch))
        summary["modes"][mode]["cost"] = entry
    summary["cost_ratio"] = (per_step["homogeneous"] / per_step["heterogeneous"]) if len(per_step) == 2 else None
    summary["prices"] = {"region": table.region, "as_of": table.as_of,
                         "dnn_instance": asdict(table.info(cfg.dnn_instance)),
                         "data_instance": asdict(table.info(cfg.data_instance))}


def cores_had(run: RunResult, cpus: list[int]) -> float | None:
    """Core-seconds per second ``cpus`` gave the run's nodes pinned to them: the cores, less the
    share other processes took of them in the run's steady state (over the whole run where the
    steady state was not measured; None: neither was)."""
    steady = [run.others_steady.get(c, run.others_steady.get(str(c))) for c in cpus]  # str keys: read back from JSON
    steady_known = [o for o in steady if o is not None]
    if cpus and len(steady_known) == len(steady):
        return sum(1.0 - o for o in steady_known)
    nodes = [n for n in run.cpu if n.get("cpus") and set(n["cpus"]) <= set(cpus) and "cpu_s" in n and n.get("wall_s")]
    busy = {c: b for c in cpus if (b := run.core_busy.get(c, run.core_busy.get(str(c)))) is not None}
    others = foreign_share(nodes, busy, cpus) if len(busy) == len(cpus) else None
    return None if others is None else len(cpus) * (1.0 - min(1.0, others))


def _median_cores(runs: list[RunResult], mode: str, cpus: list[int]) -> float:
    """The median over ``mode``'s good runs of what ``cpus`` gave them (all of ``cpus`` when unmeasured)."""
    had = [c for r in runs if r.mode == mode and r.ok and (c := cores_had(r, cpus)) is not None]
    return statistics.median(had) if had else float(len(cpus))


def _cpu_per_batch(profiles: list, on_gpu: bool) -> tuple[float, float]:
    """(CPU seconds per batch built, of the finish stage where the trainer runs on the CPU): the mean
    of ``profiles`` (taken before and after the runs: the machine's speed drifts between them)."""
    build = statistics.mean(p.cpu_s or p.median_s for p in profiles)
    finish = 0.0 if on_gpu else statistics.mean(p.finish_cpu_s or p.finish_s for p in profiles)
    return build, finish


def add_prediction(cfg: BenchConfig, summary: dict, profiles: list, runs: list[RunResult], on_gpu: bool = False,
                   beside: list | None = None) -> None:
    """The capacity model's step for both layouts (:func:`hetero.planning.planner.predict_fed_step`),
    beside the measured medians.

    Its figures: the profiles' CPU seconds per batch built and, where the trainer runs on the CPU
    (not ``on_gpu``), of its finish stage (plus a DataLoader worker's hand-off of each batch where
    the heterogeneous trainer has loader workers; a homogeneous node's own data server hands
    batches over as a data node does); for the homogeneous layout those of ``profiles`` (the
    other cores idle, as its runs leave them), for the heterogeneous one those of ``beside`` (the
    trainer's cores busy meanwhile, as its runs keep every core); and the cores each node had
    during the runs of that layout: its pinned cores less what other processes took of them in
    each run's steady state (on a shared machine the cores a run is pinned to are not all its
    own). ``pinned_step_s`` is the same model given whole pinned cores and the faster profile's
    wall seconds, as on a quiet machine whose cores do not slow each other.
    """
    if not profiles or not cfg.emulate_step_s or cfg.emulate_step_s <= 0:
        summary["prediction"] = {"note": "needs a profile and an emulated step (the GPU step time)"}
        return
    fastest = min(profiles, key=lambda p: p.median_s)
    handoff = fastest.handoff_s
    alone = _cpu_per_batch(profiles, on_gpu)
    busy = _cpu_per_batch(beside, on_gpu) if beside else alone
    pred = {"preprocess_s_per_batch_one_core": fastest.median_s, "preprocess_cpu_s_per_batch": alone[0],
            "preprocess_cpu_s_per_batch_cores_busy": busy[0], "trainer_s_per_batch": alone[1],
            "trainer_s_per_batch_cores_busy": busy[1],
            "loader_handoff_s_per_batch": handoff if cfg.loader_workers > 0 else 0.0,
            "gpu_step_s": cfg.emulate_step_s}
    basis = [r for r in runs if r.round in summary.get("quiet_rounds", [])] or runs
    for mode in MODES:
        homo = mode == "homogeneous"
        build_s, finish_s = alone if homo else busy
        loaders = not homo and cfg.loader_workers > 0
        data_cpus = [] if homo else cfg.data_cpus
        # The trainer's work lands on its own cores whether or not they also build batches.
        own_work = finish_s + (handoff if loaders else 0.0)
        trainer = _median_cores(basis, mode, cfg.trainer_cpus)
        data = _median_cores(basis, mode, data_cpus) if data_cpus else 0.0
        serves = homo or cfg.local_server
        p = predict_fed_step(build_s, cfg.emulate_step_s, trainer, data_cores=data, data_nodes=cfg.data_nodes,
                             local_server=serves, trainer_s=own_work)
        pinned = predict_fed_step(fastest.median_s, cfg.emulate_step_s, len(cfg.trainer_cpus),
                                  data_cores=len(data_cpus), data_nodes=cfg.data_nodes, local_server=serves,
                                  trainer_s=0.0 if on_gpu else fastest.finish_s + (handoff if loaders else 0.0))
        measured = summary["modes"][mode]["step_time_s"]["median"]
        pred[mode] = {"cores": len(cfg.trainer_cpus) + len(data_cpus), "cores_had": trainer + data,
                      "trainer_cores_had": trainer, "data_cores_had": data, "build_cpu_s": build_s,
                      "trainer_s": own_work, "step_s": p.step_s, "data_wait_fraction": p.data_wait_fraction,
                      "binding": p.binding, "pinned_step_s": pinned.step_s, "measured_step_s": measured,
                      "measured_over_predicted": measured / p.step_s if measured else None,
                      "measured_over_pinned": measured / pinned.step_s if measured else None}
    summary["prediction"] = pred


def measured_bytes_per_sample(runs: list[RunResult], batch_size: int) -> float | None:
    """Median over the heterogeneous runs of the data servers' bytes on the wire per sample sent
    (``bytes_sent / (batches_sent x batch_size)`` from metrics.json's ``nodes``); None without figures."""
    per_run = []
    for r in runs:
        nodes = r.figures.data_nodes if r.figures is not None else ()
        value = bytes_per_image_from_stats(sum(n.bytes_sent for n in nodes), sum(n.batches_sent for n in nodes),
                                           batch_size)
        if r.ok and value is not None:
            per_run.append(value)
    return statistics.median(per_run) if per_run else None


def add_network(cfg: BenchConfig, summary: dict, table, runs: list[RunResult], preprocess_s: float | None,
                profiled_bytes: float = 0.0) -> None:
    """Bytes per sample on the wire (measured by the data servers, else the profile's batches), the Gbps
    the heterogeneous runs moved here, and what the network would bind on the priced AWS instances.

    The projection runs the planner's network model with the profile's per-core cost on
    ``cfg.data_nodes`` x ``cfg.data_instance`` (its vCPUs) feeding one ``cfg.dnn_instance`` at the
    emulated step, each flow capped at the single-flow limit.
    """
    measured = measured_bytes_per_sample(runs, cfg.batch_size)
    per_sample = measured or profiled_bytes or None
    out: dict = {"bytes_per_sample": per_sample,
                 "bytes_source": "measured: data servers' bytes_sent per sample sent" if measured else
                 ("the profiled batches' tensors" if per_sample else None)}
    het = summary["modes"]["heterogeneous"]["samples_per_s"]["median"]
    out["heterogeneous_gbps_here"] = items_to_gbps(het, per_sample) if het and per_sample else None
    if per_sample and preprocess_s and cfg.emulate_step_s and cfg.emulate_step_s > 0:
        data, dnn = table.info(cfg.data_instance), table.info(cfg.dnn_instance)
        try:
            p = predict_network_step(preprocess_s, cfg.emulate_step_s, cfg.batch_size, 1, data.vcpus, cfg.data_nodes,
                                     per_sample, data.baseline_gbps, dnn.baseline_gbps, 1, SINGLE_FLOW_GBPS)
        except ValueError as exc:
            out["aws"] = {"note": str(exc)}
        else:
            out["aws"] = {"data_instance": cfg.data_instance, "data_nodes": cfg.data_nodes,
                          "data_baseline_gbps": data.baseline_gbps, "dnn_instance": cfg.dnn_instance,
                          "dnn_baseline_gbps": dnn.baseline_gbps, "step_s": p.step_s, "binding": p.binding,
                          "data_wait_fraction": p.data_wait_fraction,
                          "demand_gbps": items_to_gbps(cfg.batch_size / cfg.emulate_step_s, per_sample)}
    summary["network"] = out
