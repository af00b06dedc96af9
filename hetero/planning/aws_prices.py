"""SageMaker training prices and EC2 network figures read from AWS, as a dated price table.

The clients are passed in (``make_clients`` builds them with bounded timeouts and retries), so the
functions here do no I/O of their own beyond the API calls and the cache write.

What this relies on, from the AWS Price List API (``pricing`` GetProducts, service code
``AmazonSageMaker``): each PriceList item is a JSON *string*; its ``product.attributes`` carry
``regionCode`` (e.g. ``us-east-1``), ``productFamily`` (``ML Instance`` for instance-hours),
``component`` (``Training``, ``Hosting``, ``Notebook``, ...), ``instanceName`` (``ml.c5.xlarge``) and
``usagetype`` (``USE1-Train:ml.c5.xlarge``; spot usage types say ``Spot``); ``terms.OnDemand`` holds one
offer whose ``priceDimensions`` give ``pricePerUnit.USD`` per ``Hrs``. The request filters on
regionCode, productFamily and component with TERM_MATCH; the answer is checked again here, as a
filter that AWS ignores (an attribute renamed) would otherwise price hosting as training.

From EC2 DescribeInstanceTypes (type names without ``ml.``): ``VCpuInfo.DefaultVCpus``,
``GpuInfo.Gpus[].Count`` and ``NetworkInfo.NetworkCards[]`` with ``BaselineBandwidthInGbps`` and
``PeakBandwidthInGbps``. The data plane is TCP over one interface, which sits on card 0, so the
table's ``baseline_gbps``/``burst_gbps`` are card 0's; the sum over cards is kept beside them.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable

PRICING_REGION = "us-east-1"   # the Price List API answers from a few regions only; us-east-1 is one
SERVICE_CODE = "AmazonSageMaker"
CACHE_ENV = "HETERO_CACHE_DIR"
# a describe call takes at most 100 names; smaller batches keep one bad name's fallback cheap
EC2_BATCH = 50
# codes AWS answers when the caller may not read prices or instance types
DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnrecognizedClientException",
          "InvalidClientTokenId", "AuthFailure", "ExpiredToken", "ExpiredTokenException", "SignatureDoesNotMatch"}


class AwsPricesError(RuntimeError):
    """An answer from AWS that cannot be turned into a price table (the message ends with the advice)."""


class AwsAccessError(AwsPricesError):
    """No credentials, or credentials that may not read prices or instance types."""


def client_config():
    """botocore Config: every call gives up within seconds, and retries are few."""
    from botocore.config import Config

    return Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"})


def make_clients(region: str, session=None) -> tuple:
    """(pricing client on the Price List endpoint, EC2 client in ``region``)."""
    import boto3

    session = session or boto3.session.Session()
    return (session.client("pricing", region_name=PRICING_REGION, config=client_config()),
            session.client("ec2", region_name=region, config=client_config()))


def cache_dir() -> Path:
    """``$HETERO_CACHE_DIR``, else ``~/.cache/hetero``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hetero")


def cache_path(region: str) -> Path:
    """Where the refreshed table of ``region`` is kept."""
    return cache_dir() / f"prices-{region}.json"


def _aws_call(what: str, call):
    """Run ``call``; credentials problems become AwsAccessError naming the fix."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        return call()
    except NoCredentialsError:
        raise AwsAccessError(f"no AWS credentials for {what}: configure them (aws configure, AWS_PROFILE or "
                             "AWS_ACCESS_KEY_ID), or keep using the bundled price table") from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in DENIED:
            raise AwsAccessError(f"AWS refused {what} ({code}): use credentials allowed pricing:GetProducts and "
                                 "ec2:DescribeInstanceTypes, or keep using the bundled price table") from None
        raise
    except BotoCoreError as exc:
        raise AwsPricesError(f"{what} failed: {exc}; try again, or keep using the bundled price table") from None


def training_prices(pricing, region: str) -> dict[str, float]:
    """On-demand SageMaker training $/instance-hour in ``region``: {"ml.c5.xlarge": 0.204, ...}."""
    filters = [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
               {"Type": "TERM_MATCH", "Field": "productFamily", "Value": "ML Instance"},
               {"Type": "TERM_MATCH", "Field": "component", "Value": "Training"}]
    pages = pricing.get_paginator("get_products").paginate(ServiceCode=SERVICE_CODE, Filters=filters)
    items = _aws_call("pricing GetProducts", lambda: [item for page in pages for item in page.get("PriceList", [])])
    return dict(parsed for item in items if (parsed := _training_price(item, region)))


def _training_price(item, region: str) -> tuple[str, float] | None:
    try:
        doc = json.loads(item) if isinstance(item, str) else item
        attrs = doc["product"]["attributes"]
    except (TypeError, ValueError, KeyError) as exc:
        raise AwsPricesError(f"a GetProducts PriceList item is not the JSON product AWS documents ({exc}): "
                             f"{str(item)[:120]!r}; try again, or keep using the bundled price table") from None
    usage = str(attrs.get("usagetype", ""))
    training = attrs.get("component") == "Training" or "Train" in usage
    if not training or "Spot" in usage or attrs.get("regionCode", region) != region:
        return None
    name = attrs.get("instanceName") or str(attrs.get("instanceType", "")).removesuffix("-Training")
    if not name.startswith("ml."):
        return None
    for offer in (doc.get("terms", {}).get("OnDemand") or {}).values():
        for dim in (offer.get("priceDimensions") or {}).values():
            usd = (dim.get("pricePerUnit") or {}).get("USD")
            if usd is not None and dim.get("unit", "Hrs") in ("Hrs", "Hours", "hours"):
                return name, float(usd)
    return None


def instance_figures(ec2, types: Iterable[str]) -> tuple[dict[str, dict], list[str]]:
    """({"ml.c5.xlarge": {vcpus, gpus, baseline_gbps, burst_gbps, all_cards_*, network_cards}}, unknown types)."""
    names = sorted({t.removeprefix("ml.") for t in types})
    found: dict[str, dict] = {}
    unknown: list[str] = []
    for i in range(0, len(names), EC2_BATCH):
        batch = names[i:i + EC2_BATCH]
        try:
            found.update(_describe(ec2, batch))
        except _UnknownType:
            # one unknown name fails the whole call, and AWS does not say which: ask one by one
            for name in batch:
                try:
                    found.update(_describe(ec2, [name]))
                except _UnknownType:
                    unknown.append("ml." + name)
    return found, unknown


class _UnknownType(Exception):
    pass


def _describe(ec2, names: list[str]) -> dict[str, dict]:
    from botocore.exceptions import ClientError

    pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=names)
    try:
        described = _aws_call("ec2 DescribeInstanceTypes",
                              lambda: [t for page in pages for t in page.get("InstanceTypes", [])])
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "InvalidInstanceType":
            raise _UnknownType() from None
        raise
    return {"ml." + t["InstanceType"]: _figures(t) for t in described}


def _figures(t: dict) -> dict:
    cards = sorted(t.get("NetworkInfo", {}).get("NetworkCards") or [], key=lambda c: c.get("NetworkCardIndex", 0))
    first = cards[0] if cards else {}
    out: dict[str, int | float | str] = {
        "vcpus": int(t.get("VCpuInfo", {}).get("DefaultVCpus", 0)),
        "gpus": sum(int(g.get("Count", 0)) for g in t.get("GpuInfo", {}).get("Gpus") or []),
        "network_cards": len(cards)}
    gpus = t.get("GpuInfo", {}).get("Gpus") or []
    if gpus:
        out["gpu"] = str(gpus[0].get("Name", ""))
    for key, field in (("baseline_gbps", "BaselineBandwidthInGbps"), ("burst_gbps", "PeakBandwidthInGbps")):
        if first.get(field):
            out[key] = float(first[field])
        total = sum(float(c.get(field) or 0) for c in cards)
        if total:  # named as in the bundled table, where all_cards_gbps is the baseline summed over cards
            out[key.replace("baseline", "all_cards").replace("burst", "all_cards_burst")] = total
    return out


def build_table(region: str, prices: dict[str, float], figures: dict[str, dict], types: Iterable[str],
                today: str, unknown: Iterable[str] = ()) -> dict:
    """The refreshed table in prices.json's shape: one entry per type AWS knows, each figure with its source."""
    price_src, net_src = f"aws pricing GetProducts {today}", f"aws ec2 DescribeInstanceTypes {today}"
    instances, unpriced = {}, []
    for name in sorted(set(types)):
        entry: dict = {}
        if name in prices:
            entry.update(usd_per_hour=prices[name], source=price_src, date=today)
        else:
            unpriced.append(name)
        fig = figures.get(name)
        if fig:
            entry.update(fig, sizes_source=net_src)
            if "baseline_gbps" in fig:
                entry.update(network_source=net_src + " (network card 0)", network_date=today)
        if entry:
            instances[name] = entry
    return {"schema": 2, "region": region, "currency": "USD", "as_of": today,
            "unit": "on-demand SageMaker training price per instance-hour",
            "source": f"{price_src}; {net_src}", "unknown_types": sorted(set(unknown) - set(figures)),
            "unpriced_types": unpriced, "instances": instances}


def refresh(pricing, ec2, region: str, types: Iterable[str], today: str) -> dict:
    """Fetch prices and figures for ``types`` in ``region`` (raises AwsAccessError without access)."""
    types = sorted(set(types))
    prices = training_prices(pricing, region)
    figures, unknown = instance_figures(ec2, types)
    return build_table(region, prices, figures, types, today, [u for u in unknown if u not in prices])


def write_cache(doc: dict, path: Path) -> Path:
    """Write ``doc`` to ``path`` atomically: a reader sees the old table or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
