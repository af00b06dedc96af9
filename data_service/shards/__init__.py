"""Data sets stored as WebDataset-compatible tar shards, read from a folder or straight from S3.

``format`` (the layout and its index), ``cache`` (the node-local block cache), ``dataset``
(``ShardDataset``, the map-style view and block prefetcher). Bytes come through
``data_service.storage``; ``hetero prepare`` writes them (``data_service.prepare.writer``).

Data written by other tools is read in place: ``wds_index`` (``hetero index``: an index for
WebDataset tars, walked once by ``tarwalk``, labelled by ``labels``), and ``parquet``
(``ParquetDataset``: Parquet files by row group; their footers through ``parquet_meta``).
"""
from .dataset import ShardDataset

__all__ = ["ShardDataset"]
