"""An ``index.bin`` of 0 bytes (an upload or copy that stopped before its first byte) is named as
empty, with the object and the fix, in S3 (moto's real HTTP server) and in a folder."""
from __future__ import annotations

import pytest

from data_service.errors import ConfigError
from data_service.shards.indexfile import read_index


def test_an_empty_s3_index_is_named_as_empty_with_the_fix():
    from _s3_env import s3_with_bucket

    with s3_with_bucket("empty-index") as srv:
        srv.client(direct=True).put_object(Bucket="empty-index", Key="shards/index.bin", Body=b"")
        with pytest.raises(ConfigError) as err:
            read_index("s3://empty-index/shards", request_timeout_s=5.0)
    message = str(err.value)
    assert "s3://empty-index/shards/index.bin is empty (0 bytes)" in message, message
    assert "hetero prepare" in message and "hetero index" in message and "signature" not in message


def test_an_empty_index_file_in_a_folder_is_named_as_empty(tmp_path):
    (tmp_path / "index.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"index.bin is empty \(0 bytes\).*hetero prepare"):
        read_index(str(tmp_path))
