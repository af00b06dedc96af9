"""Price finished jobs with hetero/planning/cost.py and say how a benchmark pair compares.

All figures use on-demand prices from the price table (``HETERO_PRICES`` overrides it);
spot jobs are billed less, so for them the dollar figures are an upper bound.
"""
from __future__ import annotations

from hetero.sagemaker.follow import cluster_of
from launcher.metric_lines import JobMetrics


def _training_seconds(desc: dict) -> float | None:
    if desc.get("TrainingTimeInSeconds") is not None:
        return float(desc["TrainingTimeInSeconds"])
    start, end = desc.get("TrainingStartTime"), desc.get("TrainingEndTime")
    if start is not None and end is not None and hasattr(end, "timestamp"):
        return max(0.0, end.timestamp() - start.timestamp())
    return None


def summarize(desc: dict, metrics: JobMetrics | None, table) -> dict:
    """One job's figures.

    Args:
        desc: final DescribeTrainingJob response.
        metrics: its metrics.json (None if it wrote none).
        table: hetero.planning.cost.PriceTable.

    Returns:
        Dict with job, status, cluster, metrics, step_s (its average step time, None without one) and,
        where prices allow, usd_per_hour, usd_per_step, usd_per_1000_steps, training_time_s, usd_on_demand.
    """
    from launcher.capacity import PlanError

    cluster = cluster_of(desc)
    out: dict = {"job": desc["TrainingJobName"], "status": desc["TrainingJobStatus"], "cluster": cluster,
                 "metrics": metrics, "step_s": metrics.avg_step_time_s if metrics else None,
                 "spot": bool(desc.get("EnableManagedSpotTraining"))}
    if desc.get("FailureReason"):
        out["failure_reason"] = desc["FailureReason"]
    try:
        hourly = table.cluster_hourly(cluster)
    except PlanError as exc:
        out["price_error"] = str(exc)
        return out
    out["usd_per_hour"] = hourly
    if out["step_s"]:
        out["usd_per_step"] = table.cost_per_step(cluster, out["step_s"])
        out["usd_per_1000_steps"] = 1000 * out["usd_per_step"]
    seconds = _training_seconds(desc)
    if seconds is not None:
        out["training_time_s"] = seconds
        out["usd_on_demand"] = hourly * seconds / 3600
    if desc.get("BillableTimeInSeconds") is not None:
        out["billable_time_s"] = desc["BillableTimeInSeconds"]
    return out


def report_lines(summaries: list[dict]) -> list[str]:
    """Human-readable lines; for two jobs with step times, also their step-time and cost ratios."""
    lines = []
    for s in summaries:
        cluster = " + ".join(f"{n}x {t}" for t, n in s["cluster"])
        line = f"{s['job']}: {s['status']} on {cluster}"
        if s["step_s"]:
            line += f", avg step {s['step_s']:.4f} s"
            if s["metrics"].step_kind == "emulated":
                line += " (emulated accelerator step)"
        else:
            line += ", no step time (no metrics.json, or no step measured)"
        if "usd_per_step" in s:
            line += f", {100 * s['usd_per_step']:.4f} cents/step, ${s['usd_per_1000_steps']:.3f}/1000 steps"
        if "usd_on_demand" in s:
            line += f", training {s['training_time_s']:.0f} s ~ ${s['usd_on_demand']:.2f} on demand"
        if s.get("spot"):
            line += " (spot: billed less)"
        if "price_error" in s:
            line += f" [no cost: {s['price_error']}]"
        if "failure_reason" in s:
            line += f"\n  failure: {s['failure_reason']}"
        lines.append(line)
    if len(summaries) == 2 and all("usd_per_step" in s for s in summaries):
        a, b = summaries
        lines.append(f"{b['job']} / {a['job']}: step time x{b['step_s'] / a['step_s']:.2f}, "
                     f"cost per step x{b['usd_per_step'] / a['usd_per_step']:.2f} (> 1: {a['job']} is better)")
    return lines


def follow_jobs(clients, job_names: list[str], timeout_s: float, poll_s: float = 30.0, on_log=None,
                prices: str | None = None) -> list[dict]:
    """Wait for the jobs (deadline ``timeout_s``), then read their metrics and price them.

    Args:
        clients: hetero.sagemaker.client.Clients.
        job_names: one job or a pair (heterogeneous first, homogeneous second).
        timeout_s: deadline for all jobs together.
        poll_s: seconds between status polls.
        on_log: called with each new CloudWatch log line (None: no log streaming).
        prices: price file override (default: $HETERO_PRICES or hetero/planning/prices.json).

    Returns:
        One ``summarize`` dict per job, in ``job_names`` order (print with ``report_lines``).
    """
    from hetero.planning.cost import load_prices
    from hetero.sagemaker.follow import fetch_metrics, wait

    table = load_prices(prices)
    final = wait(clients, job_names, timeout_s, poll_s=poll_s, on_log=on_log)
    out = []
    for name in job_names:
        desc = final[name]
        metrics = fetch_metrics(clients.s3, desc) if desc["TrainingJobStatus"] == "Completed" else None
        out.append(summarize(desc, metrics, table))
    return out
