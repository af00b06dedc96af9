"""Dollar cost of training steps on a SageMaker cluster, from a dated price table.

The table is ``hetero/planning/prices.json`` (us-east-1 on-demand $/instance-hour, vCPUs, GPUs and
the network's baseline and burst Gbps, each figure with its source and date). ``hetero prices
--refresh`` caches AWS's figures for a region (hetero/planning/aws_prices.py); that table is merged
over the bundled one when it exists for the region.
``HETERO_PRICES=/path/to/prices.json`` or an explicit ``path`` names an override file of the
same schema: its entries add types, or replace the given fields of a known type (an entry with
only ``baseline_gbps`` keeps the type's price).

A *cluster* is a list of ``(instance_type, count)`` pairs, e.g.
``[("ml.p3.2xlarge", 1), ("ml.c5.9xlarge", 1)]``. SageMaker bills every instance of a job
for the job's whole duration, so a step costs ``step_time_s * sum(price * count) / 3600``.

Example:
    >>> table = load_prices()
    >>> round(table.cost_per_step([("ml.p3.2xlarge", 1)], 1.19) * 100, 4)  # cents
    0.1264
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

from launcher.capacity import PlanError, non_negative, positive, usd_for, whole

DEFAULT_PATH = Path(__file__).with_name("prices.json")
ENV_VAR = "HETERO_PRICES"

Cluster = Sequence[tuple[str, int]]


@dataclass(frozen=True)
class InstancePrice:
    """One row of the price table."""

    instance_type: str
    usd_per_hour: float
    vcpus: int
    gpus: int
    source: str
    date: str
    baseline_gbps: float | None = None   # sustained NIC bandwidth, in and out at once (None: unknown)
    burst_gbps: float | None = None      # the "up to" figure, minutes on credits
    network_source: str = ""
    network_date: str = ""
    gpu: str = ""                        # the accelerator's name (V100, A100, ...)
    price_origin: str = "bundled"        # which file the price came from: bundled, aws, override FILE
    network_origin: str = "bundled"

    def origin(self, network: bool = False) -> str:
        """Where the price (or the network figures) came from: bundled verified / bundled estimate /
        aws on DATE / override FILE."""
        origin, source, date = ((self.network_origin, self.network_source, self.network_date) if network else
                                (self.price_origin, self.source, self.date))
        if origin == "bundled":
            # the bundled sources say "estimate" or "not checked" where no AWS page was read
            return "bundled estimate" if "estimate" in source or "not checked" in source else "bundled verified"
        return f"aws on {date}" if origin == "aws" else origin


class PriceTable:
    """Instance prices plus the cost arithmetic built on them.

    Args:
        entries: instance type -> price row.
        region: region the prices are for.
        as_of: date of the table (its newest source).
        files: the price files merged into it, in order.
    """

    def __init__(self, entries: dict[str, InstancePrice], region: str = "us-east-1", as_of: str = "",
                 files: Sequence[str] = ()) -> None:
        self.entries = dict(entries)
        self.region = region
        self.as_of = as_of
        self.files = list(files)

    def sources_line(self, types: Iterable[str] | None = None) -> str:
        """One line: how many prices and network figures came from where (of ``types``, else all)."""
        rows = [self.info(t) for t in types] if types is not None else list(self.entries.values())

        def tally(network: bool) -> str:
            counts: dict[str, int] = {}
            for row in rows:
                if not network or row.baseline_gbps is not None:
                    counts[row.origin(network)] = counts.get(row.origin(network), 0) + 1
            return ", ".join(f"{n} {label}" for label, n in sorted(counts.items())) or "none"
        return (f"Figures: prices {tally(False)}; network {tally(True)} "
                f"(files: {', '.join(self.files) or 'none'}).")

    def known(self) -> list[str]:
        """Sorted instance types with a price."""
        return sorted(self.entries)

    def info(self, instance_type: str) -> InstancePrice:
        """The price row of ``instance_type``; raises PlanError listing known types if absent."""
        try:
            return self.entries[instance_type]
        except KeyError:
            raise PlanError(f"no price for instance type {instance_type!r}; known types: {', '.join(self.known())}. "
                            f"Add it to a price file and point {ENV_VAR} at it") from None

    def hourly(self, instance_type: str) -> float:
        """On-demand $/hour of one instance of ``instance_type``."""
        return self.info(instance_type).usd_per_hour

    def cluster_hourly(self, cluster: Cluster) -> float:
        """$/hour of a whole cluster (every instance of every group)."""
        return sum(self.hourly(instance_type) * count for instance_type, count in _check_cluster(cluster))

    def cost_per_step(self, cluster: Cluster, step_time_s: float) -> float:
        """Dollars one training step costs when a step takes ``step_time_s`` seconds."""
        return usd_for(self.cluster_hourly(cluster), positive("step_time_s", step_time_s))

    def cost_per_1000_steps(self, cluster: Cluster, step_time_s: float) -> float:
        """Dollars per 1000 steps."""
        return 1000.0 * self.cost_per_step(cluster, step_time_s)

    def cost_per_epoch(self, cluster: Cluster, step_time_s: float, steps_per_epoch: int) -> float:
        """Dollars per epoch of ``steps_per_epoch`` steps."""
        return whole("steps_per_epoch", steps_per_epoch) * self.cost_per_step(cluster, step_time_s)


def _check_cluster(cluster: Cluster) -> Iterable[tuple[str, int]]:
    if isinstance(cluster, (str, bytes)) or not cluster:
        raise PlanError(f"a cluster is a non-empty list of (instance_type, count), got {cluster!r}")
    for item in cluster:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise PlanError(f"cluster entry {item!r} must be (instance_type, count)")
        instance_type, count = item
        yield instance_type, whole(f"the count of {instance_type}", count, low=0)


def parse_cluster(text: str) -> list[tuple[str, int]]:
    """``"ml.p3.2xlarge:1,ml.c5.9xlarge:2"`` -> ``[("ml.p3.2xlarge", 1), ("ml.c5.9xlarge", 2)]``."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        instance_type, sep, count = part.rpartition(":")
        if not sep or not instance_type or not count.isdigit():
            raise PlanError(f"cluster entry {part!r} must look like TYPE:COUNT, e.g. ml.p3.2xlarge:1")
        out.append((instance_type, int(count)))
    return list(_check_cluster(out))


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"cannot read price file {path}: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("instances") or {}, dict):
        raise PlanError(f"price file {path}: needs an object with an 'instances' object of type -> entry")
    return doc


def _gbps(path: Path, name: str, row: dict, key: str) -> float | None:
    value = row.get(key)
    return None if value is None else positive(f"price file {path}: entry {name!r}: {key}", value,
                                               fix="a figure in Gbps, or leave it out when unknown")


def _row(path: Path, name: str, row: dict, as_of: str) -> InstancePrice:
    try:
        usd = float(row["usd_per_hour"])
        price = InstancePrice(name, usd, int(row.get("vcpus", 0)), int(row.get("gpus", 0)),
                              str(row.get("source", path.name)), str(row.get("date", as_of)))
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"price file {path}: entry {name!r} needs a numeric usd_per_hour >= 0 ({exc})") from exc
    non_negative(f"price file {path}: entry {name!r}: usd_per_hour", usd)
    base, burst = _gbps(path, name, row, "baseline_gbps"), _gbps(path, name, row, "burst_gbps")
    if base is not None and burst is not None and burst < base:
        raise PlanError(f"price file {path}: entry {name!r} has burst_gbps={burst} below baseline_gbps={base}; "
                        "burst is the 'up to' figure, at least the baseline")
    return replace(price, baseline_gbps=base, burst_gbps=burst if burst is not None else base,
                   network_source=str(row.get("network_source", path.name if base is not None else "")),
                   network_date=str(row.get("network_date", as_of if base is not None else "")),
                   gpu=str(row.get("gpu") or ""), price_origin=row.get(_PRICE_ORIGIN, "bundled"),
                   network_origin=row.get(_NETWORK_ORIGIN, "bundled"))


_PRICE_ORIGIN, _NETWORK_ORIGIN = "_price_origin", "_network_origin"  # kept apart from a file's own keys


def cache_region(region: str | None = None) -> str:
    """The region whose refreshed table ``load_prices`` reads: ``region``, else $AWS_REGION,
    $AWS_DEFAULT_REGION, else the bundled table's."""
    return region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def _merge(raw: dict, over_path: Path, over_doc: dict, as_of: str, origin: str, add_unpriced: bool = True) -> None:
    """Merge ``over_doc``'s entries over ``raw`` field by field, each replaced figure marked with ``origin``."""
    for name, row in (over_doc.get("instances") or {}).items():
        if not isinstance(row, dict):
            raise PlanError(f"price file {over_path}: entry {name!r} must be an object, got {row!r}")
        if name not in raw and "usd_per_hour" not in row and not add_unpriced:
            continue  # a refreshed type AWS has no price for cannot be planned with
        base, over_as_of = raw.get(name, ({}, over_path, ""))[0], over_doc.get("as_of", as_of)
        # a replaced figure takes its source from the file unless the entry names one
        cited = {**({"source": over_path.name, "date": over_as_of, _PRICE_ORIGIN: origin}
                    if "usd_per_hour" in row else {}),
                 **({"network_source": over_path.name, "network_date": over_as_of, _NETWORK_ORIGIN: origin}
                    if {"baseline_gbps", "burst_gbps"} & set(row) else {}),
                 **({"burst_gbps": None} if "baseline_gbps" in row else {})}  # a new baseline: its own burst
        raw[name] = ({**base, **cited, **row}, over_path, over_as_of)


def load_prices(path: str | os.PathLike | None = None, region: str | None = None) -> PriceTable:
    """Load the bundled table, then the table ``hetero prices --refresh`` cached for the region, then
    ``path`` (or ``$HETERO_PRICES``), each merged over the one before, field by field.

    Args:
        path: override price file; entries there replace the figures they name.
        region: whose cached table to read (default :func:`cache_region`).

    Returns:
        The merged PriceTable; each row says where its price and network figures came from.
    """
    from hetero.planning.aws_prices import cache_path

    doc = _read(DEFAULT_PATH)
    raw = {name: (dict(row), DEFAULT_PATH, doc.get("as_of", "")) for name, row in doc["instances"].items()}
    files = [DEFAULT_PATH.name]
    cached = cache_path(cache_region(region))
    override = path or os.environ.get(ENV_VAR)
    layers = [(cached, "aws")] if cached.is_file() else []
    if override:
        layers.append((Path(override), f"override {Path(override).name}"))
    for over_path, origin in layers:
        over_doc = _read(over_path)
        _merge(raw, over_path, over_doc, doc.get("as_of", ""), origin, add_unpriced=origin != "aws")
        doc = {**doc, **{k: v for k, v in over_doc.items() if k in ("region", "as_of")}}
        files.append(str(over_path))
    rows = {name: _row(p, name, row, as_of) for name, (row, p, as_of) in raw.items()}
    return PriceTable(rows, region=doc.get("region", ""), as_of=doc.get("as_of", ""), files=files)


def main(argv: list[str] | None = None) -> int:
    """``python -m hetero.planning.cost CLUSTER STEP_S [CLUSTER STEP_S]``: print costs (and ratio)."""
    p = argparse.ArgumentParser(prog="python -m hetero.planning.cost", description=main.__doc__)
    p.add_argument("runs", nargs="+", metavar="CLUSTER STEP_S", help="e.g. ml.p3.2xlarge:1 1.19")
    p.add_argument("--steps-per-epoch", type=int, default=0)
    p.add_argument("--prices", default=None, help=f"price file override (default ${ENV_VAR})")
    args = p.parse_args(argv)
    if len(args.runs) % 2:
        p.error("give CLUSTER STEP_S pairs")
    try:
        table = load_prices(args.prices)
        runs = [(args.runs[i], parse_cluster(args.runs[i]), float(args.runs[i + 1]))
                for i in range(0, len(args.runs), 2)]
        for label, cluster, step in runs:
            line = (f"{label}: {step:.3f} s/step, "
                    f"${table.cluster_hourly(cluster):.3f}/h, {100 * table.cost_per_step(cluster, step):.4f} cents/step, "
                    f"${table.cost_per_1000_steps(cluster, step):.3f}/1000 steps")
            if args.steps_per_epoch:
                line += f", ${table.cost_per_epoch(cluster, step, args.steps_per_epoch):.3f}/epoch"
            print(line)
        if len(runs) == 2:
            ratio = table.cost_per_step(*runs[0][1:]) / table.cost_per_step(*runs[1][1:])
            print(f"cost ratio first/second: {ratio:.3f}")
    except ValueError as exc:  # a PlanError, or a step time that is not a number
        print(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
