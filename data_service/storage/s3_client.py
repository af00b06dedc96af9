"""Making boto3 S3 clients: which endpoint, path-style addressing, timeouts and retries.

boto3 honours ``AWS_ENDPOINT_URL_S3`` and ``AWS_ENDPOINT_URL`` (and ``endpoint_url`` in the AWS
config file) itself; any endpoint away from AWS gets path-style addressing, which S3-compatible
servers need. boto3 is imported only when a client is made (the ``s3`` extra).

``ProcessClients`` keeps a store's clients: one of each kind per process, made on first use and
shared by the process's threads (boto3 clients are thread-safe); a forked or spawned child makes
its own.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable

from ..errors import ConfigError, install_extra
from .s3_errors import is_aws_host

INSTALL_HINT = install_extra("s3")

_STATE_LOCK = threading.Lock()  # guards making a process's lock and clients; fresh in a forked child
os.register_at_fork(after_in_child=lambda: globals().__setitem__("_STATE_LOCK", threading.Lock()))


def boto():
    """(boto3, botocore.config); ConfigError with the install command when boto3 is missing."""
    try:
        import boto3
        import botocore.config
    except ImportError as e:
        raise ConfigError(f"reading or writing s3:// URLs needs boto3, which is not installed: {INSTALL_HINT}") from e
    return boto3, botocore.config


def configured_endpoint(endpoint_url: str | None) -> tuple[str | None, str]:
    """(the endpoint asked for, where it came from); (None, "") when boto3 picks AWS's."""
    if endpoint_url:
        return endpoint_url, "the endpoint_url argument"
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return None, ""
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(var):
            return os.environ[var], var
    return None, ""


def make_client(endpoint_url: str | None, timeout_s: float, max_pool: int, attempts: int, writer: bool):
    """A new S3 client: connect and read timeouts of ``timeout_s``; botocore retries only for a
    ``writer`` (each multipart part), a reader's retries being the store's own, with the body."""
    boto3, bconfig = boto()
    configured, _ = configured_endpoint(endpoint_url)

    def make(path_style: bool):
        config = bconfig.Config(
            connect_timeout=timeout_s, read_timeout=timeout_s, max_pool_connections=max_pool, tcp_keepalive=True,
            retries={"mode": "standard", "total_max_attempts": attempts if writer else 1},
            s3={"addressing_style": "path"} if path_style else None)
        return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)

    client = make(configured is not None)
    if configured is None and not is_aws_host(client.meta.endpoint_url):
        client = make(True)  # an endpoint from the AWS config file: not AWS, so path-style
    return client


def endpoint_source(endpoint_url: str | None, client_url: str | None) -> tuple[str, str]:
    """(the endpoint a client talks to, where it came from), for messages; ``client_url`` None:
    the client could not be made."""
    configured, source = configured_endpoint(endpoint_url)
    url = client_url or configured or "?"
    if configured is not None:
        return url, source
    if not is_aws_host(url):
        return url, "endpoint_url in the AWS config file"
    return url, "boto3's default for the region"


class ProcessClients:
    """A store's clients by name ("reader", "writer"), one each per process, and a lock per process.

    A child after fork gets a fresh lock and makes its own clients, never using the parent's. A
    ``given`` client serves only the process that handed it in. The store that holds one pickles it
    as a new, empty ``ProcessClients()``.
    """

    def __init__(self, given: Any = None) -> None:
        self._given = (os.getpid(), given) if given is not None else None
        self._local: tuple[int, threading.Lock, dict] | None = None

    def mine(self) -> tuple[threading.Lock, dict]:
        """This process's lock and clients (a child after fork gets fresh ones, never the parent's)."""
        local = self._local
        pid = os.getpid()
        if local is None or local[0] != pid:
            with _STATE_LOCK:
                local = self._local
                if local is None or local[0] != pid:
                    local = (pid, threading.Lock(), {})
                    self._local = local
        return local[1], local[2]

    def get(self, name: str, make: Callable[[], Any]) -> Any:
        """This process's client ``name``: the given one in the process that handed it in, else
        ``make()``'s, made once."""
        lock, clients = self.mine()
        c = clients.get(name)
        if c is not None:
            return c
        with lock:  # one client per process: threads wait for the first one to make it
            c = clients.get(name)
            if c is None:
                c = self._given[1] if self._given is not None and self._given[0] == os.getpid() else make()
                clients[name] = c
            return c

    def close(self) -> None:
        """Close the clients this process made (their connection pools); the next ``get`` makes new ones."""
        lock, clients = self.mine()
        with lock:
            made = [c for c in clients.values() if self._given is None or c is not self._given[1]]
            clients.clear()
        for c in {id(c): c for c in made}.values():
            with contextlib.suppress(Exception):  # closing is best effort
                c.close()
