"""The storage layer: one interface over a folder and S3 (moto's server), one ``open_store``."""
from __future__ import annotations

import os

import pytest

from data_service.errors import ConfigError
from data_service.storage import LocalStore, S3Store, StoreReadError, open_store, parse_size


def test_open_store_picks_the_store_and_names_bad_locations(tmp_path):
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store("s3://bucket/prefix"), S3Store)
    for bad, match in [("", "shards=''"), ("http://x/y", "only a local folder"), ("s3://-/x", "valid bucket")]:
        with pytest.raises(ConfigError, match=match):
            open_store(bad, what="shards")


def test_sizes_parse_once_for_every_caller():
    assert parse_size("256MB", "x") == 256 * 10**6 and parse_size("1GiB", "x") == 1 << 30


def test_a_folder_store_writes_atomically_and_lists_one_level_with_versions(tmp_path):
    st = open_store(str(tmp_path / "reg"), create=True)
    st.write_bytes("servers/a.json", b"one")
    (tmp_path / "reg" / "servers" / "sub").mkdir()
    assert sorted(os.listdir(tmp_path / "reg" / "servers")) == ["a.json", "sub"]  # no temporary file left
    [(name, size, v1)] = st.list(".json", under="servers", versions=True)
    assert (name, size) == ("a.json", 3)
    assert st.read("servers/a.json", 1, 3) == b"ne"  # a ranged read keeps the file open
    st.write_bytes("servers/a.json", b"two")
    [(_, _, v2)] = st.list(".json", under="servers", versions=True)
    assert v2 != v1  # the same size, written again: another version
    assert st.read("servers/a.json") == b"two"  # a whole read sees the file that replaced it
    assert st.list(under="nothing-here") == []
    with pytest.raises(StoreReadError) as err:
        st.read("servers/gone.json")
    assert err.value.missing
    st.delete("servers/gone.json")  # nothing to delete: no error
    with pytest.raises(ConfigError, match="no such directory"):
        open_store(str(tmp_path / "nowhere")).list()


def test_staging_renames_files_into_a_folder_store(tmp_path):
    st = open_store(str(tmp_path / "out"), create=True)
    with st.staging() as folder:
        path = os.path.join(folder, "shard-000000.tar")
        with open(path, "wb") as f:
            f.write(b"x" * 10)
        st.write_file("shard-000000.tar", path)
    assert st.list() == [("shard-000000.tar", 10)] and os.listdir(tmp_path / "out") == ["shard-000000.tar"]


def test_an_s3_registry_entry_rewritten_at_the_same_size_is_read_again():
    pytest.importorskip("moto.server")
    from data_service.membership.registry import read_entries, register
    from hetero.testing.s3server import s3_server

    with s3_server() as srv, srv.environ():
        srv.client(direct=True).create_bucket(Bucket="reg")
        uri = "s3://reg/job"
        first = register(uri, "tok", "node-1", "10.0.0.1:6000", "fp", started_at=1.0)
        cache: dict = {}
        assert read_entries(uri, cache=cache)[0] == [first]
        again = register(uri, "tok", "node-1", "10.0.0.2:6000", "fp", started_at=2.0)  # restarted elsewhere
        assert len(again.to_json()) == len(first.to_json())
        assert read_entries(uri, cache=cache)[0] == [again]
