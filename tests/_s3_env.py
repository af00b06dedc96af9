"""moto's S3 server on a free loopback port, with one bucket and this process's AWS variables pointing at it."""

from __future__ import annotations

import contextlib
import os

from hetero.testing.s3server import s3_server


@contextlib.contextmanager
def s3_with_bucket(bucket: str):
    """Yield the server with ``bucket`` made and the AWS variables set; the environment is restored after."""
    saved = dict(os.environ)
    with s3_server() as srv:
        os.environ.update(srv.env)
        for var in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
            os.environ.pop(var, None)
        try:
            srv.client(direct=True).create_bucket(Bucket=bucket)
            yield srv
        finally:
            os.environ.clear()
            os.environ.update(saved)
