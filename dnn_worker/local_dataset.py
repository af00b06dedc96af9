"""``LocalDataset``: the homogeneous mode. The same pipeline, built in-process.

It yields bit-identical batches to ``RemoteDataset`` for the same seed and
epoch (both call ``data_service.contract.pipeline.build_batch``), so step time and cost
compare like for like. Use it with DataLoader workers for CPU parallelism:

    DataLoader(LocalDataset(spec, seed=1), batch_size=None, num_workers=4)
"""
from __future__ import annotations

from typing import Any, Iterator

from data_service.contract.batch_id import BatchId
from data_service.errors import BatchBuildError
from data_service.contract.pipeline import Pipeline, PipelineSpec, SampleError, build_batch

from .resume.batch_list import BatchList
from .resume.sharding import ShardedBatches


class LocalDataset(ShardedBatches):
    """Args: spec: the pipeline (import path + options). **kwargs: see ``ShardedBatches``."""

    def __init__(self, spec: PipelineSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self._pipe: Pipeline | None = None

    def pipeline(self) -> Pipeline:
        if self._pipe is None:
            self._pipe = self.spec.load()
        return self._pipe

    def finish_stage(self):
        """The pipeline's device-side finish stage (for ``DeviceFeeder``)."""
        from .device.feeder import FinishStage

        pipe = self.pipeline()
        return FinishStage.load(pipe.finish_target(), pipe.finish_dtypes, pipe.wire_encoding)

    def num_batches_per_epoch(self) -> int:
        return self.pipeline().epoch_shape().num_batches

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_pipe"] = None  # each DataLoader worker builds its own
        state["_carry"] = {}
        return state

    def _batches(self, items: BatchList) -> Iterator[tuple[BatchId, Any]]:
        pipe = self.pipeline()
        cfg = pipe.epoch_shape()
        for which in items:
            try:
                batch = build_batch(pipe, cfg, which.seed, which.epoch, which.index)
            except SampleError as exc:
                import traceback
                raise BatchBuildError(str(exc), epoch=which.epoch, index=which.index, sample_index=exc.sample_index,
                                      remote_traceback="".join(traceback.format_exception(exc.cause))) from exc
            yield which, batch
