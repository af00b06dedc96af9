"""The data-server registry: entries in a folder and in S3 (moto's real HTTP server), proofs, corruption."""
from __future__ import annotations

import json
import os

import pytest

from data_service.membership import registry
from data_service.errors import ConfigError
from data_service.membership.registry import RegistryError, read_entries, register, unregister, verify

TOKEN = "registry-token"
FP = "0123456789abcdef"


def test_folder_register_read_unregister(tmp_path):
    uri = str(tmp_path / "reg")
    os.makedirs(uri)
    assert read_entries(uri) == ([], [])  # no servers/ folder yet: no entries
    entry = register(uri, TOKEN, "node-a-1", "10.0.0.7:6000", FP)
    raw = json.loads((tmp_path / "reg" / "servers" / "node-a-1.json").read_text())
    assert set(raw) == {"address", "fingerprint", "server_id", "started_at", "proof"}
    assert raw["proof"] == registry.make_proof(TOKEN, "node-a-1", "10.0.0.7:6000", FP)
    entries, problems = read_entries(uri)
    assert entries == [entry] and problems == []
    assert verify(entry, TOKEN, FP) is None
    assert not [n for n in os.listdir(tmp_path / "reg" / "servers") if n.startswith(".")]  # no temporary left
    unregister(uri, "node-a-1")
    unregister(uri, "node-a-1")  # idempotent
    assert read_entries(uri) == ([], [])


def test_wrong_token_or_fingerprint_is_refused(tmp_path):
    uri = str(tmp_path)
    register(uri, "another-jobs-token", "intruder", "10.0.0.9:6000", FP)
    register(uri, TOKEN, "other-pipeline", "10.0.0.8:6000", "ffffffffffffffff")
    good = register(uri, TOKEN, "good", "10.0.0.7:6000", FP)
    entries, _ = read_entries(uri)
    verdicts = {e.server_id: verify(e, TOKEN, FP) for e in entries}
    assert verdicts["good"] is None
    assert "proof does not match the job token" in verdicts["intruder"]
    assert "fingerprint ffffffffffffffff" in verdicts["other-pipeline"] and FP in verdicts["other-pipeline"]
    # an entry whose address was changed after it was written no longer proves the token
    forged = registry.Entry("10.6.6.6:6000", good.fingerprint, good.server_id, good.started_at, good.proof)
    assert "proof" in verify(forged, TOKEN, FP)


def test_corrupt_entries_are_problems_not_errors(tmp_path):
    uri = str(tmp_path)
    register(uri, TOKEN, "good", "10.0.0.7:6000", FP)
    (tmp_path / "servers" / "half.json").write_bytes(b'{"address": "10.0')
    (tmp_path / "servers" / "list.json").write_text("[1, 2]")
    (tmp_path / "servers" / "short.json").write_text(json.dumps({"address": "a:1"}))
    (tmp_path / "servers" / "big.json").write_bytes(b" " * (registry.MAX_ENTRY_BYTES + 1))
    (tmp_path / "servers" / "notes.txt").write_text("ignored")
    entries, problems = read_entries(uri)
    assert [e.server_id for e in entries] == ["good"]
    assert len(problems) == 4 and any("half.json: not JSON" in p for p in problems)
    assert any("short.json: lacks" in p for p in problems)


def test_missing_registry_folder_is_an_error(tmp_path):
    with pytest.raises(RegistryError, match="does not exist"):
        read_entries(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("uri, sid, address, match", [
    ("", "a", "h:1", "folder or s3"), ("http://x/y", "a", "h:1", "only a local folder"),
    ("s3://-/x", "a", "h:1", "valid bucket"), ("DIR", "../etc", "h:1", "server_id"), ("DIR", "a", "h", "host:port"),
])
def test_bad_arguments_name_the_value(tmp_path, uri, sid, address, match):
    with pytest.raises(ConfigError, match=match):
        register(str(tmp_path) if uri == "DIR" else uri, TOKEN, sid, address, FP)


def test_s3_registry_and_unreachable_endpoint(monkeypatch):
    from hetero.testing.s3server import s3_server

    with s3_server() as srv, srv.environ():
        srv.client(direct=True).create_bucket(Bucket="registry-bucket")
        uri = "s3://registry-bucket/jobs/j1"
        assert read_entries(uri) == ([], [])
        entry = register(uri, TOKEN, "node-b-2", "10.0.0.5:6000", FP)
        srv.client(direct=True).put_object(Bucket="registry-bucket", Key="jobs/j1/servers/bad.json", Body=b"{")
        entries, problems = read_entries(uri)
        assert entries == [entry] and len(problems) == 1 and "bad.json" in problems[0]
        cache: dict = {}
        assert read_entries(uri, cache=cache)[0] == [entry]
        before = srv.proxy.requests
        assert read_entries(uri, cache=cache)[0] == [entry]  # from the cache: one LIST, no GET
        assert srv.proxy.requests - before == 1
        unregister(uri, "node-b-2")
        assert read_entries(uri, cache=cache)[0] == [] and "jobs/j1/servers/node-b-2.json" not in cache
        with pytest.raises(RegistryError, match="no such bucket"):
            read_entries("s3://no-such-registry-bucket/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", srv.endpoint)  # the server is gone now
    with pytest.raises(RegistryError, match="cannot"):
        read_entries("s3://registry-bucket/jobs/j2", timeout_s=1.0)


def test_registered_servers_lists_only_verified_entries(tmp_path, caplog):
    from dnn_worker.fetch.registry_watch import registered_servers

    register(str(tmp_path), TOKEN, "good", "10.0.0.7:6000", FP)
    register(str(tmp_path), "other-token", "intruder", "10.0.0.9:6000", FP)
    register(str(tmp_path), TOKEN, "other-pipeline", "10.0.0.8:6000", "ffffffffffffffff")
    assert registered_servers(str(tmp_path), TOKEN) == ["10.0.0.7:6000", "10.0.0.8:6000"]
    assert registered_servers(str(tmp_path), TOKEN, FP) == ["10.0.0.7:6000"]
    assert registered_servers(str(tmp_path / "gone"), TOKEN) == [] and "cannot be read" in caplog.text


def test_a_hung_registry_read_is_reported_once_and_waits_for_nothing(tmp_path, monkeypatch, caplog):
    import logging
    import threading
    import time

    from dnn_worker.fetch import registry_watch

    caplog.set_level(logging.INFO)

    real = registry_watch.verified_entries
    hung, release = threading.Event(), threading.Event()

    def read(*args, **kwargs):  # a network file system that stops answering until released
        if hung.is_set():
            release.wait(10.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(registry_watch, "verified_entries", read)
    register(str(tmp_path), TOKEN, "good", "10.0.0.7:6000", FP)
    w = registry_watch.RegistryWatcher(str(tmp_path), TOKEN, poll_s=0.1, timeout_s=0.3)
    assert w.wait_read(0, timeout=5.0)
    hung.set()
    time.sleep(0.2)
    for _ in range(8):  # the consumer's loop goes on: each snapshot returns at once
        start = time.monotonic()
        version, servers = w.snapshot()
        # a snapshot that waited for the hung read would wait 10 s: it is released after this loop
        assert time.monotonic() - start < 5.0 and list(servers) == ["10.0.0.7:6000"]
        time.sleep(0.1)
    hung.clear()
    release.set()
    assert w.wait_read(w.reads + 1, timeout=5.0)
    assert caplog.text.count("a read has taken") == 1 and caplog.text.count("can be read again") == 1
    assert w.error is None


def test_an_entry_not_refreshed_within_its_ttl_is_refused_by_every_reader(tmp_path):
    import time

    from dnn_worker.fetch.registry_watch import registered_servers

    uri = str(tmp_path)
    fresh = register(uri, TOKEN, "fresh", "10.0.0.7:6000", FP, ttl_s=10.0)
    register(uri, TOKEN, "stale", "10.0.0.8:6000", FP, ttl_s=10.0)
    forever = register(uri, TOKEN, "forever", "10.0.0.9:6000", FP)  # no TTL: never expires
    assert json.loads((tmp_path / "servers" / "stale.json").read_text())["ttl_s"] == 10.0
    good, refused = registry.verified_entries(uri, TOKEN, FP)
    assert {e.server_id for e in good} == {"fresh", "stale", "forever"} and refused == []
    # "stale" was last written 10.5 s ago on the file system's clock; the heartbeat rewrites "fresh"
    old = time.time() - 10.5
    for name in ("stale", "fresh", "forever"):
        os.utime(tmp_path / "servers" / f"{name}.json", (old, old))
    again = register(uri, TOKEN, "fresh", fresh.address, FP, ttl_s=10.0, started_at=fresh.started_at)
    good, refused = registry.verified_entries(uri, TOKEN, FP)
    assert {e.server_id for e in good} == {"fresh", "forever"} and again.started_at == fresh.started_at
    assert [(e.server_id, "expired" in why and "TTL is 10 s" in why) for e, why in refused] == [("stale", True)]
    assert forever.expired(1e6) is False
    assert "10.0.0.8:6000" not in registered_servers(uri, TOKEN)  # the end-of-job shutdown list too
    assert "10.0.0.9:6000" in registered_servers(uri, TOKEN)


def _skewed_reader(monkeypatch, skew_s: float) -> None:
    """The reader's clock ``skew_s`` seconds off (its registry module's time), the store's untouched."""
    import time
    from types import SimpleNamespace

    real = time.time
    monkeypatch.setattr(registry, "time", SimpleNamespace(time=lambda: real() + skew_s))


@pytest.mark.parametrize("skew_s", [3600.0, -3600.0])
def test_a_reader_with_a_skewed_clock_sees_exactly_the_live_servers_in_a_folder(tmp_path, monkeypatch, skew_s):
    import time

    uri = str(tmp_path)
    register(uri, TOKEN, "live", "10.0.0.7:6000", FP, ttl_s=15.0)
    register(uri, TOKEN, "dead", "10.0.0.8:6000", FP, ttl_s=15.0)
    old = time.time() - 60  # killed a minute ago: no beat since
    os.utime(tmp_path / "servers" / "dead.json", (old, old))
    _skewed_reader(monkeypatch, skew_s)
    good, refused = registry.verified_entries(uri, TOKEN, FP)
    assert [e.server_id for e in good] == ["live"]
    assert [e.server_id for e, _ in refused] == ["dead"] and "expired" in refused[0][1]


@pytest.mark.parametrize("skew_s", [3600.0, -3600.0])
def test_a_reader_with_a_skewed_clock_sees_exactly_the_live_servers_on_s3(monkeypatch, skew_s):
    import time

    from _s3_env import s3_with_bucket

    bucket = "skew-ahead" if skew_s > 0 else "skew-behind"  # a store (its client) per endpoint
    with s3_with_bucket(bucket):
        uri = f"s3://{bucket}/jobs/skew"
        register(uri, TOKEN, "dead", "10.0.0.8:6000", FP, ttl_s=1.0)
        time.sleep(2.5)  # S3 times are whole seconds: "dead" is 2-3 s past its last write, its TTL 1 s
        register(uri, TOKEN, "live", "10.0.0.7:6000", FP, ttl_s=30.0)
        _skewed_reader(monkeypatch, skew_s)
        good, refused = registry.verified_entries(uri, TOKEN, FP)
        assert [e.server_id for e in good] == ["live"]
        assert [e.server_id for e, _ in refused] == ["dead"] and "expired" in refused[0][1]


@pytest.mark.parametrize("ttl", [-1.0, float("inf"), float("nan")])
def test_a_bad_ttl_names_the_value(tmp_path, ttl):
    with pytest.raises(ConfigError, match="ttl_s="):
        register(str(tmp_path), TOKEN, "a", "10.0.0.7:6000", FP, ttl_s=ttl)


def test_a_bad_ttl_field_is_a_problem_not_an_error(tmp_path):
    register(str(tmp_path), TOKEN, "a", "10.0.0.7:6000", FP, ttl_s=5.0)
    raw = json.loads((tmp_path / "servers" / "a.json").read_text())
    (tmp_path / "servers" / "a.json").write_text(json.dumps(dict(raw, ttl_s="soon")))
    entries, problems = read_entries(str(tmp_path))
    assert entries == [] and len(problems) == 1 and "ttl_s='soon'" in problems[0]


def test_a_heartbeat_keeps_the_entry_fresh_and_stops_before_it_is_removed(tmp_path):
    import time

    from data_service.membership.joining import Heartbeat

    uri = str(tmp_path)
    entry = register(uri, TOKEN, "beating", "10.0.0.7:6000", FP, ttl_s=0.3)
    beat = Heartbeat(uri, TOKEN, entry, timeout_s=1.0).start()
    try:
        deadline = time.monotonic() + 10
        while beat.beats < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert beat.beats >= 3
        (got,), _ = read_entries(uri)
        assert got.refreshed_at > entry.refreshed_at and got.started_at == entry.started_at
        assert registry.verified_entries(uri, TOKEN, FP)[0] == [got]
    finally:
        beat.stop()
    unregister(uri, "beating")
    time.sleep(0.3)
    assert read_entries(uri) == ([], [])  # no beat after stop() brings it back
    with pytest.raises(ConfigError, match="TTL > 0"):
        Heartbeat(uri, TOKEN, register(uri, TOKEN, "x", "10.0.0.7:6000", FP))


def test_leaving_while_a_heartbeat_write_is_in_flight_ends_with_the_entry_removed(tmp_path, monkeypatch):
    """A beat's write that outlasts leave's wait for it lands after the delete: the heartbeat then
    deletes the entry again, so the delete is the last write and the server does not reappear."""
    import threading
    from types import SimpleNamespace

    from data_service.membership import joining

    uri = str(tmp_path)
    entered, gate = threading.Event(), threading.Event()
    real = joining.register

    def slow(*args, **kwargs):  # the heartbeat's writes: held until the test lets them through
        entered.set()
        assert gate.wait(10)
        return real(*args, **kwargs)

    left = []
    server = SimpleNamespace(token=TOKEN, server_id="leaving", dataset_info=SimpleNamespace(fingerprint=FP),
                             created_at=None, on_leave=left.append)
    joining.join(server, uri, "10.0.0.7:6000", timeout_s=0.2, ttl_s=0.3)  # registers before the patch
    monkeypatch.setattr(joining, "register", slow)
    assert entered.wait(10), "a beat started its write"
    beating = [t for t in threading.enumerate() if t.name == "heartbeat leaving"]
    left[0]()  # the server leaves: its wait for the held write ends at its deadline (0.2 s)
    assert read_entries(uri) == ([], [])
    gate.set()  # the held write lands now, after the delete
    beating[0].join(10)
    assert not beating[0].is_alive()
    assert read_entries(uri) == ([], [])  # deleted again: the server stays gone
