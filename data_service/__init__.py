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
from .pipeline import Pipeline, PipelineSpec, SkipSample
from .version import PROTOCOL_VERSION

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
