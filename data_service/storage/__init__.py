"""Object storage behind one interface: a local folder or ``s3://bucket/prefix``.

``open_store(url)`` gives a :class:`~data_service.storage.base.Store` (ranged read, size, list,
atomic put, put from a file, delete); the shard source, the registry of data servers and
``hetero prepare`` all use it and never ask which kind they have.

``base`` (the interface and its errors), ``local`` (a folder), ``s3`` (S3 with retries and
deadlines), ``s3_retry`` (the retry loop, the deadlines and the ranged GET body read),
``s3_client`` (making boto3 clients: endpoint, addressing; one per process), ``s3_errors`` (what
an S3 failure means and the fix to name), ``parsing`` (locations and sizes as users give them).
"""
from __future__ import annotations

from .base import Store, StoreError, StoreReadError, StoreWriteError
from .local import LocalStore
from .parsing import check_location, is_s3_url, parse_s3_url, parse_size
from .s3 import S3Store
from .s3_client import INSTALL_HINT


def open_store(url: str, *, what: str = "location", create: bool = False, **s3_options) -> Store:
    """The store at ``url``: a :class:`LocalStore` for a folder, an :class:`S3Store` for ``s3://bucket/prefix``.

    Args:
        what: the option ``url`` came from, named in errors ("shards", "registry").
        create: make a missing folder now (an S3 prefix needs no making).
        s3_options: keyword arguments of :class:`S3Store` (deadlines, retries); unused for a folder.

    Raises:
        ConfigError: ``url`` is empty, of another scheme, or an S3 URL without a valid bucket.
    """
    url = check_location(url, what)
    if is_s3_url(url):
        return S3Store(url, **s3_options)
    return LocalStore(url, create=create)


__all__ = ["INSTALL_HINT", "LocalStore", "S3Store", "Store", "StoreError", "StoreReadError", "StoreWriteError",
           "check_location", "is_s3_url", "open_store", "parse_s3_url", "parse_size"]
