"""CPU-side data service: runs a user's pipeline in worker processes and serves batches.

A batch travels: ``sampler.EpochPlan`` picks its sample indices ->
``pipeline.build_batch`` runs dataset + transforms + collate in a worker
(``workers``) -> ``codec`` lays its tensors out as raw bytes in a shared
memory slot -> ``server`` sends header + bytes on the data plane ->
``dnn_worker.connection`` receives them and ``codec.decode`` rebuilds tensors.
"""
from .errors import (
    BatchBuildError,
    ConfigError,
    DataServiceError,
    PermissionDeniedError,
    ProtocolError,
    ServerUnavailableError,
    VersionMismatchError,
)
from .version import PROTOCOL_VERSION

_PIPELINE_NAMES = ("Pipeline", "PipelineSpec", "SkipSample")


def __getattr__(name: str):
    # The pipeline module imports torch (a second of a data server's start): loaded when first
    # named, so a server's main process starts its workers before it pays for torch.
    if name in _PIPELINE_NAMES:
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'data_service' has no attribute {name!r}")

__all__ = [
    "BatchBuildError",
    "ConfigError",
    "DataServiceError",
    "PermissionDeniedError",
    "Pipeline",
    "PipelineSpec",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "ServerUnavailableError",
    "SkipSample",
    "VersionMismatchError",
]
