"""S3Store against moto's real server on a loopback port, behind the S3 fault proxy.

Every fault S3 really shows (503 SlowDown, 500, a reset before or during the body, a stall before
or after the headers, a body shorter than its Content-Length) is retried and the read returns the
right bytes; faults that persist end in StoreReadError naming the object within the deadline; set-up
problems (no bucket, no key, access denied, no credentials, no endpoint) fail check() at once
with the fix in the message.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from data_service.errors import ConfigError  # noqa: E402
from data_service.storage import INSTALL_HINT, S3Store, StoreReadError, is_s3_url, parse_s3_url  # noqa: E402
from hetero.ports import free_port  # noqa: E402
from hetero.testing.s3proxy import S3FaultProxy  # noqa: E402
from hetero.testing.s3server import s3_server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "shards"
DATA = os.urandom(3 * (1 << 20) + 12345)  # a "shard": several body chunks, not a round size
FAST = {"request_timeout_s": 0.5, "attempts": 4, "backoff_base_s": 0.01, "backoff_max_s": 0.05}
# No fault injected and no retry expected: a deadline that only catches a hang, so a loaded
# machine's slow answer is not taken for a fault.
CALM = {"request_timeout_s": 30.0}
_AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION",
             "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
             "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")


@pytest.fixture(scope="module")
def srv():
    with s3_server() as s:
        c = s.client(direct=True)
        c.create_bucket(Bucket=BUCKET)
        c.put_object(Bucket=BUCKET, Key="data/shard-000000.tar", Body=DATA)
        c.put_object(Bucket=BUCKET, Key="data/shard-000001.tar", Body=DATA[::-1])
        yield s


@pytest.fixture
def s3(srv, monkeypatch, tmp_path):
    """The module's server with this test's environment: its env, no AWS config of the machine."""
    for var in _AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    for k, v in srv.env.items():
        monkeypatch.setenv(k, v)
    srv.proxy.clear_faults()
    srv.proxy.reset_counters()
    yield srv
    srv.proxy.clear_faults()


def store(prefix: str = "data", **kw) -> S3Store:
    return S3Store(f"s3://{BUCKET}/{prefix}", **{**FAST, **kw})


def slack_s(s3, floor: float = 1.0) -> float:
    """Seconds a timed read may take beyond what its faults cost: ``floor``, or 4 x a clean first read
    (a new client, its connection and one GET through the proxy, timed now) where that is more, so
    the bounds hold on a slow or loaded machine. Clears the proxy's faults."""
    s3.proxy.clear_faults()
    t0 = time.monotonic()
    store().read("shard-000000.tar", 0, 10)
    return max(floor, 4 * (time.monotonic() - t0))


# -- URLs ------------------------------------------------------------------------------------------
def test_parse_s3_url():
    assert parse_s3_url("s3://bucket/a/b") == ("bucket", "a/b")
    assert parse_s3_url("s3://bucket") == ("bucket", "")
    assert parse_s3_url("s3://bucket/a/") == ("bucket", "a/")
    assert is_s3_url("s3://b/x") and not is_s3_url("/data/x") and not is_s3_url(None)  # type: ignore[arg-type]
    for bad in ("http://b/k", "/data", "s3://", "s3:///k", "s3://b c/k"):
        with pytest.raises(ConfigError, match="s3://bucket/prefix") as e:
            parse_s3_url(bad)
        assert repr(bad) in str(e.value)


def test_keys_join_the_prefix_whatever_its_slashes(s3):
    for prefix in ("data", "data/", "data//"):
        st = store(prefix)
        assert st.key_url("shard-000000.tar") == f"s3://{BUCKET}/data/shard-000000.tar"
        assert st.size("shard-000000.tar") == len(DATA)
    top = store("")
    assert top.size("data/shard-000000.tar") == len(DATA)
    assert ("data/shard-000001.tar", len(DATA)) in top.list(".tar")


# -- round trip --------------------------------------------------------------------------------------
def test_round_trip_write_list_read(s3, tmp_path):
    st = store("rt/run1/", **CALM)
    other = store("rt/run10", **CALM)  # a prefix that extends run1's: never listed with it
    other.write_bytes("x.tar", b"x")
    st.write_bytes("index.json", b'{"shards": 2}')
    f = tmp_path / "shard.tar"
    f.write_bytes(DATA)
    st.write_file("shard-000000.tar", str(f))
    st.multipart_bytes = 5 << 20  # S3's smallest part: 11 MB goes up in 3 parts
    big = os.urandom(11 << 20)
    f.write_bytes(big)
    st.write_file("shard-000001.tar", str(f))
    assert st.list() == [("index.json", 13), ("shard-000000.tar", len(DATA)), ("shard-000001.tar", len(big))]
    assert st.list(".tar") == [("shard-000000.tar", len(DATA)), ("shard-000001.tar", len(big))]
    st.list_page_size = 1  # paginated: one key per LIST
    s3.proxy.reset_counters()
    assert [k for k, _ in st.list()] == ["index.json", "shard-000000.tar", "shard-000001.tar"]
    assert s3.proxy.counters()["requests"]["GET"] >= 3
    assert st.read("index.json") == b'{"shards": 2}'
    assert st.read("shard-000001.tar") == big
    assert st.read("shard-000000.tar", 100, 100 + 70000) == DATA[100:70100]
    assert st.read("shard-000000.tar", len(DATA) - 10) == DATA[-10:]
    assert st.read("shard-000000.tar", 5, 5) == b""
    assert st.size("shard-000001.tar") == st.check("shard-000001.tar") == len(big)
    assert st.exists("index.json") and not st.exists("nope.tar")
    st.delete("index.json")
    assert not st.exists("index.json")
    assert st.retries == 0


def test_counters_count_what_the_proxy_saw(s3):
    st = store(**CALM)
    ranges = [(0, 1000), (1 << 20, 3 << 20), (5, len(DATA))]
    for a, b in ranges:
        assert st.read("shard-000000.tar", a, b) == DATA[a:b]
    c = s3.proxy.counters()
    assert c["requests"] == {"GET": 3}
    assert c["ranged_gets"] == 3
    assert st.requests == 3
    assert st.bytes_read == sum(b - a for a, b in ranges) == c["body_bytes"]["GET"] == s3.proxy.get_bytes
    assert c["path_bytes"] == {f"/{BUCKET}/data/shard-000000.tar": st.bytes_read}
    assert c["connections"] == 1  # keep-alive: one connection for the three GETs
    s3.proxy.reset_counters()
    assert s3.proxy.requests == 0 and s3.proxy.get_bytes == 0


def test_threads_share_one_client_and_the_counters_add_up(s3):
    st = store(attempts=6, **CALM)  # only the injected faults are retried
    s3.proxy.fail_next("503", count=6, method="GET")
    s3.proxy.fail_next("truncate", count=3, method="GET")
    part = 256 << 10
    jobs = [(k, a) for k in ("shard-000000.tar", "shard-000001.tar") for a in range(0, len(DATA) - part, part)]
    want = {"shard-000000.tar": DATA, "shard-000001.tar": DATA[::-1]}
    errors = []

    def work(mine):
        for key, a in mine:
            if st.read(key, a, a + part) != want[key][a:a + part]:
                errors.append((key, a))

    threads = [threading.Thread(target=work, args=(jobs[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    c = s3.proxy.counters()
    assert st.retries == 9 == sum(c["faults"].values())
    assert st.requests == len(jobs) + 9 == c["requests"]["GET"]
    # the halves of the truncated bodies count too: bytes_read is what came over the wire
    shard_bytes = sum(n for path, n in c["path_bytes"].items() if path.endswith(".tar"))
    assert st.bytes_read == shard_bytes == len(jobs) * part + 3 * part // 2
    assert len(st._clients.mine()[1]) == 1  # one reader client for every thread


# -- endpoints ---------------------------------------------------------------------------------------
def test_aws_endpoint_url_is_honoured(s3):
    st = store()
    assert st.read("shard-000000.tar", 0, 10) == DATA[:10]
    assert s3.proxy.requests == 1
    assert st.endpoint_and_source() == (s3.endpoint, "AWS_ENDPOINT_URL")


def test_aws_endpoint_url_s3_wins_over_aws_endpoint_url(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
    st = store()
    assert st.read("shard-000001.tar", 0, 10) == DATA[::-1][:10]
    assert s3.proxy.requests == 1
    assert st.endpoint_and_source() == (s3.endpoint, "AWS_ENDPOINT_URL_S3")


@pytest.mark.parametrize("var", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_unreachable_endpoint_is_named_with_its_variable(s3, monkeypatch, var):
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv(var, dead)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        store().check("shard-000000.tar")
    assert time.monotonic() - t0 < 5
    msg = str(e.value)
    assert f"cannot reach the S3 endpoint {dead}" in msg and f"from {var}" in msg and "shard-000000.tar" in msg


# -- faults that pass ----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.serial  # it times each retried read: beside the suite's heavier tests a stall took 2.2 s, not 0.6
@pytest.mark.parametrize("kind", ["503", "500", "reset", "reset_body", "stall", "stall_headers", "truncate"])
def test_a_fault_is_retried_and_the_read_is_right(s3, kind):
    st = store()
    s3.proxy.fail_next(kind, match="shard-000000", method="GET")
    t0 = time.monotonic()
    assert st.read("shard-000000.tar", 1000, len(DATA) - 1000) == DATA[1000:-1000]
    elapsed = time.monotonic() - t0
    assert st.retries == 1
    assert s3.proxy.counters()["faults"] == {kind: 1}
    assert s3.proxy.counters()["requests"]["GET"] == st.requests == 2
    assert elapsed < FAST["request_timeout_s"] + slack_s(s3, 1.5)  # a stall costs one read timeout, nothing hangs


@pytest.mark.parametrize("kind", ["503", "reset", "stall_headers"])
def test_check_and_list_retry_too(s3, kind):
    st = store()
    s3.proxy.fail_next(kind, method="HEAD")
    assert st.check("shard-000000.tar") == len(DATA)
    s3.proxy.fail_next(kind, method="GET", match="list-type")
    assert [k for k, _ in st.list(".tar")] == ["shard-000000.tar", "shard-000001.tar"]
    assert st.retries == 2


def test_a_write_survives_a_503(s3):
    st = store("writes")
    s3.proxy.fail_next("503", method="PUT")
    st.write_bytes("a.bin", b"abc")
    assert st.read("a.bin") == b"abc"
    assert s3.proxy.counters()["faults"] == {"503": 1}


def test_the_store_pickles_and_a_forked_child_makes_its_own_client(s3):
    st = store()
    assert st.read("shard-000000.tar", 0, 4) == DATA[:4]
    parent_client = st._client()
    copy = pickle.loads(pickle.dumps(st))
    assert copy.read("shard-000000.tar", 4, 8) == DATA[4:8]
    assert copy._client() is not parent_client
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        q.put((st.read("shard-000000.tar", 8, 16), id(st._client()) == id(parent_client)))

    p = ctx.Process(target=child)
    p.start()
    data, shared = q.get(timeout=30)
    p.join(timeout=30)
    assert p.exitcode == 0 and data == DATA[8:16] and not shared


# -- faults that persist ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["503", "500", "reset", "stall", "stall_headers", "truncate"])
def test_a_persistent_fault_ends_in_a_read_error_naming_the_object(s3, kind):
    st = store(deadline_s=3.0)
    st._client()  # a client's creation (seconds on a loaded machine) is not what is timed
    s3.proxy.fail_next(kind, count=100, method="GET")
    t0 = time.monotonic()
    with pytest.raises(StoreReadError) as e:
        st.read("shard-000001.tar", 0, 1 << 20)
    elapsed = time.monotonic() - t0
    msg = str(e.value)
    assert f"s3://{BUCKET}/data/shard-000001.tar" in msg and "after 4 attempt(s)" in msg, msg
    assert e.value.bucket == BUCKET and e.value.key == "shard-000001.tar" and e.value.retryable
    assert st.retries == 3 and s3.proxy.counters()["faults"] == {kind: 4}
    # 4 attempts; a stall costs at most one read timeout each, the back-off at most 0.05 s each
    assert elapsed < 4 * FAST["request_timeout_s"] + 3 * FAST["backoff_max_s"] + slack_s(s3, 1.5)


def test_the_overall_deadline_stops_retries_early(s3):
    st = store(attempts=100, deadline_s=1.2)
    st._client()
    s3.proxy.fail_next("stall", count=1000, method="GET")
    t0 = time.monotonic()
    with pytest.raises(StoreReadError, match="shard-000000.tar"):
        st.read("shard-000000.tar", 0, 1000)
    elapsed = time.monotonic() - t0
    # Without the deadline the 100 attempts of stalled GETs would take 50 s and more; the slack's
    # floor covers a loaded machine's scheduling (3.1 s was seen under a full parallel test run).
    assert 1.0 < elapsed < 1.2 + FAST["request_timeout_s"] + slack_s(s3, floor=2.0)
    assert st.retries < 4


def test_a_trickling_body_is_abandoned_at_the_deadline(s3):
    slow = S3FaultProxy(s3.moto.get_host_and_port(), bandwidth_bps=400_000)  # 3 MB would take 8 s
    try:
        st = store(endpoint_url=slow.endpoint, request_timeout_s=5, deadline_s=1.0)
        st._client()
        t0 = time.monotonic()
        with pytest.raises(StoreReadError, match="deadline") as e:
            st.read("shard-000000.tar")
        took = time.monotonic() - t0
        assert took < 1.0 + 256_000 / 400_000 + slack_s(s3)
        assert f"s3://{BUCKET}/data/shard-000000.tar" in str(e.value)
    finally:
        slow.close()


def test_latency_is_added_before_the_first_byte(s3):
    s3.proxy.latency_s = 0.2
    try:
        st = store()
        st.size("shard-000000.tar")  # connect first
        t0 = time.monotonic()
        st.read("shard-000000.tar", 0, 10)
        took = time.monotonic() - t0
    finally:
        s3.proxy.latency_s = 0.0
    assert 0.2 <= took < 0.2 + slack_s(s3, 0.8)


# -- clear errors ---------------------------------------------------------------------------------------
def test_missing_bucket(s3):
    with pytest.raises(ConfigError, match="check the bucket name and region") as e:
        S3Store("s3://no-such-bucket/data", **FAST).check("index.json")
    assert "no such bucket 'no-such-bucket'" in str(e.value)
    with pytest.raises(StoreReadError, match="no such bucket 'no-such-bucket'"):
        S3Store("s3://no-such-bucket/data", **FAST).read("index.json", 0, 10)
    with pytest.raises(ConfigError, match="no such bucket 'no-such-bucket'"):
        S3Store("s3://no-such-bucket/data", **FAST).list()


def test_missing_key(s3):
    st = store(**CALM)
    with pytest.raises(ConfigError) as e:
        st.check("index.json")
    assert str(e.value) == (f"no such key s3://{BUCKET}/data/index.json; run `hetero prepare` to write shards "
                            "there, or check the prefix")
    t0 = time.monotonic()
    with pytest.raises(StoreReadError, match="no such key"):
        st.read("index.json", 0, 10)
    took = time.monotonic() - t0
    assert st.retries == 0 and took < slack_s(s3)  # not retried


@pytest.mark.parametrize("method", ["HEAD", "GET"])
def test_access_denied_names_the_permissions(s3, method):
    st = store(**CALM)
    s3.proxy.fail_next("403", method=method)
    with pytest.raises((ConfigError, StoreReadError)) as e:
        st.check("shard-000000.tar") if method == "HEAD" else st.read("shard-000000.tar", 0, 10)
    msg = str(e.value)
    assert f"access denied to s3://{BUCKET}/data/shard-000000.tar" in msg
    assert "need s3:GetObject and s3:ListBucket on" in msg and f"arn:aws:s3:::{BUCKET}/data/*" in msg
    assert isinstance(e.value, ConfigError if method == "HEAD" else StoreReadError)
    assert st.retries == 0


def test_no_credentials(s3, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="no AWS credentials found") as e:
        store().check("shard-000000.tar")
    assert "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile" in str(e.value)
    assert "instance role" in str(e.value) and f"s3://{BUCKET}/data/shard-000000.tar" in str(e.value)
    assert time.monotonic() - t0 < 5
    assert s3.proxy.requests == 0


def test_ranges_outside_the_object(s3):
    st = store(**CALM)
    with pytest.raises(StoreReadError, match=rf"past the end .*size {len(DATA)}"):
        st.read("shard-000000.tar", len(DATA) - 10, len(DATA) + 10)
    with pytest.raises(StoreReadError, match="outside"):
        st.read("shard-000000.tar", len(DATA) + 10, len(DATA) + 20)
    with pytest.raises(ValueError):
        st.read("shard-000000.tar", 10, 5)
    assert st.retries == 0


def test_without_boto3_the_error_names_the_extra(s3, monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    with pytest.raises(ConfigError, match="needs boto3") as e:
        store().check("shard-000000.tar")
    assert INSTALL_HINT in str(e.value) and "pip install -e '.[s3]'" in INSTALL_HINT


def test_importing_the_module_does_not_import_boto3():
    code = "import sys, data_service.storage; assert 'boto3' not in sys.modules and 'botocore' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
