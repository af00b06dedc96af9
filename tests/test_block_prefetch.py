"""A data server prefetches each block once per epoch, through the pipeline's explicit
``server_side`` prefetcher, and its main process never builds the data set or the transform."""
from __future__ import annotations

import collections
import os

import pytest

from conftest import TOKEN
from data_service.contract.batch_id import BatchId
from data_service.server.block_prefetch import PrefetchOnce
from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec
from data_service.contract.sampler import EpochShape
from data_service.server import DataServer, ServerOptions
from dnn_worker import RemoteDataset


def _serve_one_epoch(log, seed: int = 1) -> list[list[str]]:
    spec = PipelineSpec("tests._prefetch_pipeline:build", {"log": str(log)})
    server = DataServer(spec, TOKEN, ServerOptions(num_workers=2, probe=False)).start()
    try:
        ds = RemoteDataset([server.address], TOKEN, seed=seed, window=2)
        assert len(list(ds)) == 32
    finally:
        server.shutdown(grace_s=1)
    return [line.split() for line in log.read_text().splitlines()]


def test_each_block_is_prefetched_once_per_epoch_though_hinted_and_requested(tmp_path):
    """16 blocks of 2 batches each: a hint and a request for each batch, one prefetch per block."""
    events = _serve_one_epoch(tmp_path / "events")
    prefetches = collections.Counter(int(b) for kind, b in events if kind == "prefetch")
    assert prefetches == {b: 1 for b in range(16)}, prefetches


def test_the_server_process_builds_neither_the_data_set_nor_the_transform(tmp_path):
    events = _serve_one_epoch(tmp_path / "events")
    built = {(kind, int(pid)) for kind, pid in events if kind in ("dataset", "transform")}
    assert built, "the workers build the pipeline"
    assert os.getpid() not in {pid for _, pid in built}, built  # the server runs in this process


def test_a_builder_without_server_side_is_built_only_by_the_workers_and_its_hooks_are_named(tmp_path, caplog):
    log = tmp_path / "events"
    spec = PipelineSpec("tests._prefetch_pipeline:build_plain", {"log": str(log)})
    server = DataServer(spec, TOKEN, ServerOptions(num_workers=1, probe=False)).start()
    try:
        assert len(list(RemoteDataset([server.address], TOKEN, seed=1))) == 32
    finally:
        server.shutdown(grace_s=1)
    built = [int(pid) for kind, pid in (line.split() for line in log.read_text().splitlines())
             if kind in ("dataset", "transform", "close")]
    assert built and os.getpid() not in built, built
    assert "sets Pipeline close, which a data server does not call" in caplog.text


def test_a_later_epoch_prefetches_its_blocks_again_once():
    class Log:
        block_samples = 8

        def __init__(self) -> None:
            self.calls: list[int] = []

        def prefetch_block(self, block: int) -> None:
            self.calls.append(block)

    log = Log()
    plan = EpochShape(64, 4, False, True, 8, 2)
    once = PrefetchOnce(log, plan)
    for epoch in (0, 0, 1):  # epoch 0 named twice (hints, then requests), epoch 1 once
        for index in range(plan.num_batches):
            once.batch(BatchId(7, epoch, index))
    assert collections.Counter(log.calls) == {b: 2 for b in range(8)} and once.triggered == 16


def test_workers_that_build_different_pipelines_stop_the_server_at_start(tmp_path):
    spec = PipelineSpec("tests._prefetch_pipeline:uneven", {"marker": str(tmp_path / "first")})
    with pytest.raises(ConfigError, match="different pipelines"):
        DataServer(spec, TOKEN, ServerOptions(num_workers=2, probe=False)).start()
