"""A sweep's price: N training jobs with a data group each, or one data group shared by all of them.

Given one job's plan (``planner.plan``: its DNN group and the cheapest data group that keeps it
fed), ``sweep_prices`` prices N such jobs three ways, with the planner's own step model:

* **separate**: each job with its own data group (N x the plan's cluster);
* **shared, within the window**: the N jobs of one seed read one data group with a batch window
  and stay within it, so each batch is built once for all of them: the cores build one job's
  batches, the NICs carry N jobs' (``preprocess_s / N`` per batch delivered, N x the consumers);
* **shared, jobs apart**: the same group when the jobs drift further apart than the window holds
  (or run their own seeds without a decoded cache): every batch is built for each job, as N jobs
  on one group; and the cheapest count of the same type that keeps the target even then.

A job's dollars are its DNN group's plus its share (1/N) of a shared data group, over its steps.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

from launcher.capacity import Binding, PlanError, Prediction, usd_for, whole

from .planner import Layouts, Option, Plan


@dataclass(frozen=True)
class SweepRow:
    """One way to run the sweep: its data group, each job's step, and what it costs."""

    label: str
    data_instance: str
    data_nodes: int            # in all, for the whole sweep
    step_s: float              # each job's predicted step
    data_wait_fraction: float
    binding: Binding
    usd_per_hour: float        # the whole sweep
    usd_per_job_1000_steps: float
    usd_per_job_epoch: float | None
    meets_target: bool


def _predict(layouts: Layouts, data_instance: str, nodes: int, jobs: int = 1, built_once: bool = False) -> Prediction:
    """The step of each of ``jobs`` jobs like the plan's fed by ``nodes`` data nodes of ``data_instance``:
    one job is the plan's own layout (its DNN nodes' own cores too, with ``local_server``); jobs on
    one shared group are fed by the group alone (a DNN-only job reads the shared group), and with
    ``built_once`` each batch the group builds serves every job."""
    if jobs > 1:
        w = layouts.workload
        layouts = replace(layouts, workload=replace(
            w, dnn_count=jobs * w.dnn_count, local_server=False,
            preprocess_s=w.preprocess_s / jobs if built_once else w.preprocess_s))
    return layouts.predict(layouts.table.info(data_instance), nodes)


def _row(label: str, one: Plan, jobs: int, data_instance: str, nodes: int, pred: Prediction,
         separate: bool) -> SweepRow:
    w, table = one.workload, one.layouts.table
    dnn_hourly = table.cluster_hourly([(w.dnn_instance, w.dnn_count)])
    data_hourly = table.cluster_hourly([(data_instance, nodes)])
    per_job_hourly = dnn_hourly + (data_hourly if separate else data_hourly / jobs)
    per_step = usd_for(per_job_hourly, pred.step_s)
    epoch = one.layouts.steps_per_epoch
    return SweepRow(label, data_instance, nodes * (jobs if separate else 1), pred.step_s, pred.data_wait_fraction,
                    pred.binding, per_job_hourly * jobs, 1000 * per_step, epoch * per_step if epoch else None,
                    pred.data_wait_fraction <= w.target_wait + 1e-12)


def sweep_prices(one: Plan, jobs: int, max_count: int = 64) -> list[SweepRow]:
    """The sweep of ``jobs`` jobs like ``one``'s, priced the three ways of the module docstring.

    Raises:
        PlanError: ``jobs`` below 2, or a plan with no data group to share.
    """
    whole("jobs", jobs, low=2, fix="a sweep of one job is the plan itself")
    group: Option | None = one.data_group or next((c for c in one.candidates if c.data_instance), None)
    if group is None:
        raise PlanError("the plan has no data group to share: give --data-types with at least one CPU instance type")
    layouts = one.layouts
    # a data group's, or a candidate's with a data instance: every candidate is a layout with data nodes
    data_instance, n = cast(str, group.data_instance), group.data_count
    separate = _predict(layouts, data_instance, n)
    within = _predict(layouts, data_instance, n, jobs, built_once=True)
    apart = _predict(layouts, data_instance, n, jobs)
    rows = [_row(f"{jobs} separate groups of {n} x {data_instance}", one, jobs, data_instance, n, separate, True),
            _row(f"1 shared group of {n} x {data_instance}, jobs within the window", one, jobs,
                 data_instance, n, within, False),
            _row(f"1 shared group of {n} x {data_instance}, jobs apart", one, jobs, data_instance, n, apart, False)]
    for k in range(n + 1, max_count + 1):  # the group that keeps the target even when every batch is built again
        pred = _predict(layouts, data_instance, k, jobs)
        if pred.data_wait_fraction <= one.workload.target_wait + 1e-12:
            rows.append(_row(f"1 shared group of {k} x {data_instance}, sized for jobs apart", one, jobs,
                             data_instance, k, pred, False))
            break
        if pred.binding is Binding.DNN_NIC:
            break  # more data nodes cannot help: the DNN nodes' NICs bind
    return rows


def _versus(row: SweepRow, sep: SweepRow) -> str:
    """What one job costs with ``row`` against separate groups: the factor, cheaper or dearer, and both prices."""
    ratio = row.usd_per_job_1000_steps / sep.usd_per_job_1000_steps
    prices = f"${row.usd_per_job_1000_steps:.4f} against ${sep.usd_per_job_1000_steps:.4f} per job per 1000 steps"
    if abs(ratio - 1) < 0.005:
        return f"each job costs the same as with separate groups ({prices})"
    cheaper = f", {1 / ratio:.2f}x cheaper" if ratio < 1 else ", dearer"
    return f"each job costs {ratio:.2f}x as much as with separate groups ({prices}{cheaper})"


def format_sweep(rows: list[SweepRow], jobs: int) -> str:
    """The sweep's rows as Markdown, with the saving per job of the shared group."""
    lines = [f"Sweep of {jobs} jobs (hetero plan --jobs {jobs}; docs/sweep.md):", "",
             "| layout | data nodes in all | step each (s) | data wait | binds | sweep $/h | $ per job per 1000 steps | "
             "$ per job per epoch | meets target |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        epoch = "n/a" if r.usd_per_job_epoch is None else f"{r.usd_per_job_epoch:.4f}"
        lines.append(f"| {r.label} | {r.data_nodes} | {r.step_s:.4f} | {r.data_wait_fraction:.1%} | {r.binding} | "
                     f"{r.usd_per_hour:.3f} | {r.usd_per_job_1000_steps:.4f} | {epoch} | "
                     f"{'yes' if r.meets_target else 'no'} |")
    sep, within = rows[0], rows[1]
    lines += ["", f"Shared within the window: {_versus(within, sep)}, each job's step {within.step_s:.4f} s "
                  f"against {sep.step_s:.4f} s (binding: {within.binding})."]
    sized = rows[3] if len(rows) > 3 else None
    if not within.meets_target and sized is not None:
        lines.append(f"A shared group sized for jobs apart, {sized.data_nodes} x {sized.data_instance}, keeps the "
                     f"target within the window too: {_versus(sized, sep)}.")
    lines.append("Jobs that drift further apart than the window holds have their batches built again: the "
                 "'jobs apart' rows price that case.")
    return "\n".join(lines)
