"""``hetero prices --refresh``: prices and network figures from AWS (hetero/planning/aws_prices.py,
hetero/commands/prices.py) and the loader's order: bundled, then the refreshed cache, then the override.

Requests and answers go through botocore's Stubber, which checks both against the service models.
"""
from __future__ import annotations

import json

import botocore.session
import pytest
from botocore.stub import Stubber

from hetero import cli
from hetero.commands import prices as prices_cmd
from hetero.planning import aws_prices, cost
from hetero.planning.cost import load_prices

TODAY_PATTERN = r"\d{4}-\d{2}-\d{2}"
REGION = "us-west-2"
FILTERS = [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": REGION},
           {"Type": "TERM_MATCH", "Field": "productFamily", "Value": "ML Instance"},
           {"Type": "TERM_MATCH", "Field": "component", "Value": "Training"}]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv(aws_prices.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(cost.ENV_VAR, raising=False)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)


def _client(service: str, region: str = "us-east-1"):
    return botocore.session.get_session().create_client(
        service, region_name=region, aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret")


def price_item(name: str, usd: str, component: str = "Training", usage: str = "", region: str = REGION) -> str:
    """One PriceList entry as GetProducts sends it: a JSON document in a string."""
    sku = "SKU" + name.replace(".", "")[:10].upper()
    return json.dumps({
        "product": {"productFamily": "ML Instance", "sku": sku, "attributes": {
            "regionCode": region, "location": "US West (Oregon)", "servicecode": "AmazonSageMaker",
            "instanceName": name, "instanceType": f"{name}-{component}", "component": component,
            "usagetype": usage or f"USW2-{'Train' if component == 'Training' else 'Host'}:{name}",
            "operation": "RunInstance", "vCpu": "4"}},
        "serviceCode": "AmazonSageMaker",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                "description": f"${usd} per On Demand {name} instance-hour", "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                "pricePerUnit": {"USD": usd}}},
            "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
            "termAttributes": {}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z"})


def instance_type(name: str, vcpus: int, cards: list[tuple[float, float]], gpus: list[int] = ()) -> dict:
    """One DescribeInstanceTypes entry, with a network card per (baseline, peak)."""
    out = {"InstanceType": name, "VCpuInfo": {"DefaultVCpus": vcpus},
           "NetworkInfo": {"NetworkPerformance": "Up to 10 Gigabit", "MaximumNetworkCards": len(cards),
                           "DefaultNetworkCardIndex": 0,
                           "NetworkCards": [{"NetworkCardIndex": i, "BaselineBandwidthInGbps": b,
                                             "PeakBandwidthInGbps": p, "NetworkPerformance": f"{p:g} Gigabit"}
                                            for i, (b, p) in reversed(list(enumerate(cards)))]}}
    if gpus:
        out["GpuInfo"] = {"Gpus": [{"Name": "A100", "Manufacturer": "NVIDIA", "Count": n,
                                    "MemoryInfo": {"SizeInMiB": 40960}} for n in gpus]}
    return out


def stub_pricing(pricing, pages: list[list[str]]) -> Stubber:
    stub = Stubber(pricing)
    for i, page in enumerate(pages):
        expected = {"ServiceCode": "AmazonSageMaker", "Filters": FILTERS, **({"NextToken": f"t{i}"} if i else {})}
        stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": page,
                                           **({"NextToken": f"t{i + 1}"} if i + 1 < len(pages) else {})}, expected)
    return stub


def test_training_prices_follow_pages_and_keep_only_on_demand_training():
    pricing = _client("pricing")
    pages = [[price_item("ml.c5.xlarge", "0.2380000000"), price_item("ml.c5.xlarge", "0.2900000000", "Hosting"),
              price_item("ml.c5.2xlarge", "0.1000000000", usage="USW2-Train-Spot:ml.c5.2xlarge")],
             [price_item("ml.p3.2xlarge", "3.8250000000"),
              price_item("ml.m5.xlarge", "0.5", region="eu-west-1")]]
    with stub_pricing(pricing, pages) as stub:
        got = aws_prices.training_prices(pricing, REGION)
        stub.assert_no_pending_responses()
    assert got == {"ml.c5.xlarge": 0.238, "ml.p3.2xlarge": 3.825}


def test_a_price_list_item_that_is_not_json_names_itself():
    pricing = _client("pricing")
    with stub_pricing(pricing, [["{not json"]]):
        with pytest.raises(aws_prices.AwsPricesError, match="not the JSON product.*not json"):
            aws_prices.training_prices(pricing, REGION)


def test_network_figures_are_card_zeros_and_pages_are_followed():
    ec2 = _client("ec2", REGION)
    stub = Stubber(ec2)
    asked = {"InstanceTypes": ["c5.xlarge", "p4d.24xlarge"]}
    stub.add_response("describe_instance_types",
                      {"InstanceTypes": [instance_type("c5.xlarge", 4, [(1.25, 10.0)])], "NextToken": "n1"}, asked)
    stub.add_response("describe_instance_types",
                      {"InstanceTypes": [instance_type("p4d.24xlarge", 96, [(100.0, 100.0), (50.0, 60.0)], [4, 4])]},
                      {**asked, "NextToken": "n1"})
    with stub:
        figures, unknown = aws_prices.instance_figures(ec2, ["ml.p4d.24xlarge", "ml.c5.xlarge"])
        stub.assert_no_pending_responses()
    assert unknown == []
    assert figures["ml.c5.xlarge"] == {"vcpus": 4, "gpus": 0, "network_cards": 1, "baseline_gbps": 1.25,
                                       "burst_gbps": 10.0, "all_cards_gbps": 1.25, "all_cards_burst_gbps": 10.0}
    p4d = figures["ml.p4d.24xlarge"]
    assert (p4d["gpus"], p4d["gpu"], p4d["network_cards"]) == (8, "A100", 2)
    assert (p4d["baseline_gbps"], p4d["burst_gbps"]) == (100.0, 100.0)   # card 0, listed last in the answer
    assert (p4d["all_cards_gbps"], p4d["all_cards_burst_gbps"]) == (150.0, 160.0)


def stub_ec2_with_unknown(ec2) -> Stubber:
    """The batch fails on the unknown name, then each name is asked alone."""
    stub = Stubber(ec2)
    stub.add_client_error("describe_instance_types", "InvalidInstanceType", "The following supplied instance types "
                          "do not exist: [zz9.huge]", expected_params={"InstanceTypes": ["c5.xlarge", "zz9.huge"]})
    stub.add_response("describe_instance_types", {"InstanceTypes": [instance_type("c5.xlarge", 4, [(1.25, 10.0)])]},
                      {"InstanceTypes": ["c5.xlarge"]})
    stub.add_client_error("describe_instance_types", "InvalidInstanceType", "does not exist",
                          expected_params={"InstanceTypes": ["zz9.huge"]})
    return stub


def test_an_unknown_type_is_listed_and_the_others_still_described():
    ec2 = _client("ec2", REGION)
    with stub_ec2_with_unknown(ec2) as stub:
        figures, unknown = aws_prices.instance_figures(ec2, ["ml.c5.xlarge", "ml.zz9.huge"])
        stub.assert_no_pending_responses()
    assert sorted(figures) == ["ml.c5.xlarge"] and unknown == ["ml.zz9.huge"]


def _refresh_cli(monkeypatch, capsys, pricing_pages, argv):
    pricing, ec2 = _client("pricing"), _client("ec2", REGION)
    monkeypatch.setattr(prices_cmd, "make_clients", lambda region: (pricing, ec2))
    with stub_pricing(pricing, pricing_pages), stub_ec2_with_unknown(ec2):
        code = cli.main(["prices", "--refresh", "--region", REGION, *argv])
    return code, "".join(capsys.readouterr())


def test_refresh_writes_the_cache_and_the_planner_reads_it_with_sources(monkeypatch, capsys, tmp_path):
    code, out = _refresh_cli(monkeypatch, capsys, [[price_item("ml.c5.xlarge", "0.2380000000")]],
                             ["--types", "ml.c5.xlarge,ml.zz9.huge"])
    assert code == 0, out
    path = tmp_path / "cache" / f"prices-{REGION}.json"
    assert f"1 prices (pricing GetProducts), 1 network figures (ec2 DescribeInstanceTypes) -> {path}" in out
    assert "unknown to AWS in us-west-2 (kept from the bundled table, if there): ml.zz9.huge" in out
    doc = json.loads(path.read_text())
    entry = doc["instances"]["ml.c5.xlarge"]
    assert entry["usd_per_hour"] == 0.238 and entry["source"].startswith("aws pricing GetProducts ")
    assert entry["network_source"].startswith("aws ec2 DescribeInstanceTypes ")
    assert not list(path.parent.glob("*.tmp"))

    table = load_prices(region=REGION)
    row = table.info("ml.c5.xlarge")
    assert (row.usd_per_hour, row.baseline_gbps, row.burst_gbps) == (0.238, 1.25, 10.0)
    assert row.origin() == f"aws on {doc['as_of']}" == row.origin(network=True)
    assert table.info("ml.p3.2xlarge").origin() == "bundled verified"   # not refreshed: the bundled figure
    assert table.info("ml.c5n.xlarge").origin() == "bundled estimate"
    assert table.region == REGION and table.files == ["prices.json", str(path)]
    assert "| ml.c5.xlarge | 0.238 | 4 | 0 | 1.25/10 | aws on " in out
    line = table.sources_line(["ml.c5.xlarge", "ml.p3.2xlarge"])
    assert line.startswith(f"Figures: prices 1 aws on {doc['as_of']}, 1 bundled verified;") and str(path) in line
    assert load_prices(region="eu-west-1").info("ml.c5.xlarge").origin() == "bundled verified"  # other region


def test_the_override_file_still_wins_over_the_cache(monkeypatch, capsys, tmp_path):
    assert _refresh_cli(monkeypatch, capsys, [[price_item("ml.c5.xlarge", "0.2380000000")]],
                        ["--types", "ml.c5.xlarge,ml.zz9.huge"])[0] == 0
    override = tmp_path / "mine.json"
    override.write_text(json.dumps({"instances": {"ml.c5.xlarge": {"usd_per_hour": 0.1}}}))
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv(cost.ENV_VAR, str(override))
    row = load_prices().info("ml.c5.xlarge")
    assert row.usd_per_hour == 0.1 and row.origin() == "override mine.json"
    assert row.baseline_gbps == 1.25 and row.origin(network=True).startswith("aws on ")


@pytest.mark.parametrize("denied", ["no credentials", "AccessDeniedException"])
def test_without_access_it_says_so_exits_2_and_writes_nothing(monkeypatch, capsys, tmp_path, denied):
    if denied == "no credentials":
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                     "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                     "AWS_WEB_IDENTITY_TOKEN_FILE"):
            monkeypatch.delenv(name, raising=False)
        for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
            monkeypatch.setenv(name, str(tmp_path / "absent"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        session = botocore.session.Session()

        def no_network(**kwargs):
            raise AssertionError("a request was sent without credentials")
        session.register("before-send", no_network)
        monkeypatch.setattr(prices_cmd, "make_clients", lambda region: (
            session.create_client("pricing", region_name="us-east-1", config=aws_prices.client_config()),
            session.create_client("ec2", region_name=region, config=aws_prices.client_config())))
        code = cli.main(["prices", "--refresh", "--region", REGION])
    else:
        pricing = _client("pricing")
        monkeypatch.setattr(prices_cmd, "make_clients", lambda region: (pricing, _client("ec2", region)))
        with Stubber(pricing) as stub:
            stub.add_client_error("get_products", denied, "User is not authorized to perform: pricing:GetProducts",
                                  http_status_code=400)
            code = cli.main(["prices", "--refresh", "--region", REGION])
    out = "".join(capsys.readouterr())
    assert code == 2
    assert len(out.strip().splitlines()) == 1 and "keep using the bundled price table" in out
    assert ("configure them" if denied == "no credentials" else f"({denied})") in out
    assert not (tmp_path / "cache").exists()


def test_aws_out_of_reach_is_one_line_giving_its_advice_once(monkeypatch, capsys, tmp_path):
    from botocore.exceptions import EndpointConnectionError

    session = botocore.session.Session()
    session.set_credentials("AKIDEXAMPLE", "secret")

    def unreachable(request, **kwargs):
        raise EndpointConnectionError(endpoint_url=request.url)
    session.register("before-send", unreachable)
    monkeypatch.setattr(prices_cmd, "make_clients", lambda region: (
        session.create_client("pricing", region_name="us-east-1", config=aws_prices.client_config()),
        session.create_client("ec2", region_name=region, config=aws_prices.client_config())))
    assert cli.main(["prices", "--refresh", "--region", REGION]) == 1
    out = "".join(capsys.readouterr())
    assert len(out.strip().splitlines()) == 1 and "pricing GetProducts failed: Could not connect" in out, out
    assert out.count("try again") == 1 and out.count("bundled") == 1, out
    assert not (tmp_path / "cache").exists()


def test_a_region_without_prices_writes_nothing(monkeypatch, capsys, tmp_path):
    code, out = _refresh_cli(monkeypatch, capsys, [[]], ["--types", "ml.c5.xlarge,ml.zz9.huge"])
    assert code == 2 and "no SageMaker training price in region 'us-west-2'" in out and "check --region" in out
    assert not (tmp_path / "cache").exists()


def test_types_must_be_sagemaker_names(capsys):
    assert cli.main(["prices", "--types", "c5.xlarge"]) == 2
    assert "--types c5.xlarge: SageMaker instance types start with 'ml.'" in "".join(capsys.readouterr())


def test_clients_time_out_and_retry_a_bounded_number_of_times():
    config = aws_prices.client_config()
    assert config.connect_timeout and config.read_timeout and config.retries["max_attempts"] <= 5
    pricing, ec2 = aws_prices.make_clients("eu-west-1", botocore_session_with_keys())
    assert pricing.meta.region_name == "us-east-1" and ec2.meta.region_name == "eu-west-1"
    assert ec2.meta.config.read_timeout == config.read_timeout


def botocore_session_with_keys():
    import boto3

    return boto3.session.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret")
