"""moto's real S3 server on a free loopback port with the fault proxy in front, for tests, benchmarks
and users testing their own jobs against S3 without AWS (docs/testing.md).

    with s3_server(latency_s=0.03) as srv:          # moto on a free port, the proxy in front
        os.environ.update(srv.env)                  # AWS_ENDPOINT_URL -> the proxy, dummy keys

``python -m hetero.testing.s3server`` runs one until Ctrl-C and prints the environment to use.
"""
from __future__ import annotations

import contextlib
import http.client
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .s3proxy import S3FaultProxy


@dataclass
class S3Server:
    """What ``s3_server`` yields: moto's server, the proxy in front and the environment a client
    needs (``env``: AWS_ENDPOINT_URL -> the proxy, dummy credentials, us-east-1, no IMDS)."""
    moto: object
    proxy: S3FaultProxy
    moto_endpoint: str

    @property
    def endpoint(self) -> str:
        return self.proxy.endpoint

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    @contextlib.contextmanager
    def environ(self) -> Iterator[None]:
        """Set ``env`` in os.environ (AWS_ENDPOINT_URL_S3 and AWS_PROFILE cleared) for the block."""
        keys = list(self.env) + ["AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"]
        saved = {k: os.environ.get(k) for k in keys}
        for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            os.environ.pop(k, None)
        os.environ.update(self.env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def client(self, direct: bool = False):
        """A boto3 S3 client on the proxy (or straight on moto with ``direct``), path-style."""
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.moto_endpoint if direct else self.endpoint,
                            region_name="us-east-1", aws_access_key_id="testing",
                            aws_secret_access_key="testing", config=Config(s3={"addressing_style": "path"}))

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API, called straight on moto)."""
        host, port = self.moto_endpoint.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("POST", "/moto-api/reset")
            conn.getresponse().read()
        finally:
            conn.close()


@contextlib.contextmanager
def s3_server(latency_s: float = 0.0, bandwidth_bps: float | None = None,
              stall_max_s: float | None = None) -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port with an ``S3FaultProxy`` in front; both stop on exit.

    moto keeps its buckets in this process's memory (shared with any other moto server or mock
    here), so tests use their own bucket names or call ``reset()``.
    """
    import logging

    from moto.server import ThreadedMotoServer

    wlog = logging.getLogger("werkzeug")  # moto's server logs every request at INFO
    level = wlog.level
    wlog.setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    proxy = S3FaultProxy((host, port), latency_s=latency_s, bandwidth_bps=bandwidth_bps, stall_max_s=stall_max_s)
    try:
        yield S3Server(moto=moto, proxy=proxy, moto_endpoint=f"http://{host}:{port}")
    finally:
        proxy.close()
        moto.stop()
        wlog.setLevel(level)


def serve_forever_main() -> None:  # pragma: no cover - a manual helper: python -m hetero.testing.s3server
    import argparse
    ap = argparse.ArgumentParser(description="moto S3 behind a latency/fault proxy, until Ctrl-C")
    ap.add_argument("--latency-s", type=float, default=0.0)
    ap.add_argument("--bandwidth-bps", type=float, default=None)
    args = ap.parse_args()
    with s3_server(latency_s=args.latency_s, bandwidth_bps=args.bandwidth_bps) as srv:
        print("\n".join(f"export {k}={v}" for k, v in srv.env.items()), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":  # pragma: no cover
    serve_forever_main()


__all__ = ["S3Server", "s3_server"]
