"""Data sets stored as WebDataset-compatible tar shards, read from a folder or straight from S3.

``format`` (the layout and its index), ``cache`` (the node-local block cache), ``dataset``
(``ShardDataset``, the map-style view and block prefetcher). Bytes come through
``data_service.storage``; ``hetero prepare`` writes them (``hetero.prepare``).
"""
from .dataset import ShardDataset

__all__ = ["ShardDataset"]
