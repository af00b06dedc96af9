"""The shard stores' old import path: ``data_service.storage`` holds them."""
from ..storage import LocalStore, open_store  # noqa: F401
