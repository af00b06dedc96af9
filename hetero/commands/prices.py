"""``hetero prices``: the price table the planner uses, and where each figure came from.

Without options it prints the merged table (the bundled hetero/planning/prices.json, then the
table refreshed from AWS for the region if one is cached, then the --prices / HETERO_PRICES
override) with each figure's origin: bundled verified, bundled estimate, aws on DATE or override
FILE. ``--refresh`` reads the on-demand SageMaker training prices of the region from the AWS Price
List API and the vCPUs, GPUs and network card bandwidths from EC2 DescribeInstanceTypes, and caches
them in $HETERO_CACHE_DIR (default ~/.cache/hetero) as prices-REGION.json, which the planner, the
live advice and the autoscaler then read. It needs AWS credentials allowed pricing:GetProducts and
ec2:DescribeInstanceTypes. Exit codes: 0 done, 1 AWS failed, 2 bad input or no access.
"""
from __future__ import annotations

import argparse
import sys
import datetime

from hetero.planning.aws_prices import AwsAccessError, AwsPricesError, cache_path, make_clients, refresh, write_cache


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "prices", "show the price table and its sources; --refresh reads it from AWS",
                    __doc__, raw=True)
    p.add_argument("--refresh", action="store_true", help="read prices and network figures from AWS and cache them")
    p.add_argument("--region", default=None,
                   help="AWS region of the prices (default $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1)")
    p.add_argument("--types", default="", help="comma-separated instance types (default: those the bundled table knows)")
    p.add_argument("--prices", default=None, help="override price file merged last (default $HETERO_PRICES)")
    p.set_defaults(func=run)


def _types(text: str) -> list[str]:
    from data_service.errors import ConfigError

    types = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in types if not t.startswith("ml.")]
    if bad:
        raise ConfigError(f"--types {', '.join(bad)}: SageMaker instance types start with 'ml.', e.g. ml.c5.xlarge")
    return types


def do_refresh(region: str, types: list[str]) -> int:
    """Fetch, cache and summarise; nothing is written unless AWS answered with prices."""
    from hetero.planning.cost import DEFAULT_PATH, _read

    from botocore.exceptions import ClientError

    types = types or sorted(_read(DEFAULT_PATH)["instances"])
    try:
        pricing, ec2 = make_clients(region)
        today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
        doc = refresh(pricing, ec2, region, types, today)
    except AwsAccessError as exc:
        print(f"hetero prices: {exc}", file=sys.stderr)
        return 2
    except AwsPricesError as exc:  # AWS out of reach, or an answer that is not a table: it says what to do
        print(f"hetero prices: reading prices from AWS failed: {exc}", file=sys.stderr)
        return 1
    except ClientError as exc:  # AWS refused for another reason than access
        print(f"hetero prices: reading prices from AWS failed: {exc}; try again, or keep using the bundled price "
              "table", file=sys.stderr)
        return 1
    priced = [n for n, e in doc["instances"].items() if "usd_per_hour" in e]
    if not priced:
        print(f"hetero prices: AWS lists no SageMaker training price in region {region!r} for the types asked; "
              "check --region (e.g. us-east-1) and --types; nothing written", file=sys.stderr)
        return 2
    path = write_cache(doc, cache_path(region))
    networked = [n for n, e in doc["instances"].items() if "baseline_gbps" in e]
    print(f"refreshed {region} on {doc['as_of']}: {len(priced)} prices (pricing GetProducts), {len(networked)} "
          f"network figures (ec2 DescribeInstanceTypes) -> {path}")
    if doc["unknown_types"]:
        print(f"unknown to AWS in {region} (kept from the bundled table, if there): {', '.join(doc['unknown_types'])}")
    missing = sorted(set(doc["unpriced_types"]) - set(doc["unknown_types"]))
    if missing:
        print(f"no SageMaker training price in {region} (bundled price kept): {', '.join(missing)}")
    return 0


def print_table(table, types: list[str]) -> None:
    """The table in use, one row per type with its figures' origins."""
    print(f"Prices for {table.region} as of {table.as_of}, from {' then '.join(table.files)}")
    print("| type | $/h | vCPUs | GPUs | baseline/burst Gbps | price from | network from |")
    print("|---|---|---|---|---|---|---|")
    shown = [t for t in types if t in table.entries] if types else table.known()
    for name in shown:
        r = table.info(name)
        net = "-" if r.baseline_gbps is None else f"{r.baseline_gbps:g}/{r.burst_gbps:g}"
        print(f"| {name} | {r.usd_per_hour:.3f} | {r.vcpus} | {r.gpus} | {net} | {r.origin()} | "
              f"{r.origin(network=True) if r.baseline_gbps is not None else '-'} |")
    if len(shown) < len(types):
        print(f"no price known for {', '.join(t for t in types if t not in table.entries)}: add it to a price file "
              "(--prices or HETERO_PRICES)")
    print(table.sources_line(shown))


def run(args: argparse.Namespace) -> int:
    from hetero.planning.cost import cache_region, load_prices
    from launcher.capacity import PlanError

    types = _types(args.types)
    region = cache_region(args.region)
    if args.refresh:
        code = do_refresh(region, types)
        if code:
            return code
    try:
        print_table(load_prices(args.prices, region=region), types)
    except PlanError as exc:
        print(f"hetero prices: {exc}", file=sys.stderr)
        return 2
    return 0
