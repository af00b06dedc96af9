"""The S3 store's old import path: ``data_service.storage`` holds it."""
from ..storage import INSTALL_HINT, S3Store  # noqa: F401
