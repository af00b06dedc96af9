"""The S3 store's old import path: ``data_service.storage.s3`` holds it."""
from ..storage.s3 import INSTALL_HINT, S3Store  # noqa: F401
