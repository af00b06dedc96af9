"""CPU-side data service: runs a user's pipeline in worker processes and serves batches.

Its rooms, by job (docs/architecture.md):

* ``contract/``: what both sides share: the pipeline, the epoch plan (sampler), the tensor
  layout of a batch, compression and the image wire encodings;
* ``protocol/``: the generated gRPC/protobuf code, framing, the token proof, TLS, addresses,
  the protocol version;
* ``server/``: the data server (control plane, event-loop data plane, sessions, stats);
* ``pool/``: the data worker processes and the one class that owns their state;
* ``membership/``: the registry of servers and joining it;
* ``storage/``, ``shards/``, ``pipelines/``: where bytes come from and the ready-made pipelines.

A consumer (``dnn_worker``) imports the contract, the protocol, membership, storage and the
errors; never the server or the pool (tests/test_layering.py).
"""
import importlib

from .errors import (BatchBuildError, BatchFailedError, ConfigError, DataServiceError, PermissionDeniedError,
                     ProtocolError, ServerUnavailableError, VersionMismatchError)
from .protocol.version import PROTOCOL_VERSION

_LAZY = {"Pipeline": "contract.pipeline", "PipelineSpec": "contract.pipeline", "SkipSample": "contract.pipeline",
         "DataServer": "server", "ServerOptions": "server"}


def __getattr__(name: str):
    # The pipeline module imports torch (a second of a data server's start), the server grpc:
    # loaded when first named, so a server's main process starts its workers before it pays.
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'data_service' has no attribute {name!r}")


__all__ = ["BatchBuildError", "BatchFailedError", "ConfigError", "DataServer", "DataServiceError",
           "PermissionDeniedError", "Pipeline", "PipelineSpec", "PROTOCOL_VERSION", "ProtocolError", "ServerOptions",
           "ServerUnavailableError", "SkipSample", "VersionMismatchError"]
