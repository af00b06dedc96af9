"""Jobs come and go on a sweep's data group: a job that joins through the registry starts its own
epoch (from its batch 0, exact), and the data group ends once the last job has been gone for its
idle timeout."""
from __future__ import annotations

import threading
import time

import pytest

from conftest import TOKEN
from data_service.contract.tensor_layout import batch_digest
from data_service.errors import ConfigError
from data_service.server.lifetime import EXIT_NO_CONSUMER, IdleExit
from dnn_worker import RemoteDataset
from hetero.testing.audit import Reference, read_audit

PIPELINE = "examples.synthetic:build_pipeline"
OPTIONS = {"size": 96, "batch_size": 8}  # 12 batches


@pytest.mark.slow
def test_a_job_joining_a_running_group_starts_its_own_epoch_and_the_group_ends_after_the_last(
        server_process, tmp_path):
    registry = tmp_path / "registry"
    server = server_process(OPTIONS, workers=1, batch_window="1MB")
    server.cmd += ["--join", str(registry), "--idle-timeout", "2", "--leave-delay", "0"]
    server.start()
    expected = Reference(PIPELINE, OPTIONS, 4).digests(0)
    first_batches = threading.Event()
    got: dict[str, list[str]] = {}
    errors: list = []

    def job(name: str, step_s: float, signal: threading.Event | None) -> None:
        try:
            ds = RemoteDataset(registry=str(registry), token=TOKEN, seed=4, audit_path=str(tmp_path / f"{name}.jsonl"),
                               connect_timeout=60, batch_timeout=30)
            ds.set_epoch(0)
            out = got.setdefault(name, [])
            for batch in ds:
                out.append(batch_digest(batch))
                if signal is not None and len(out) == 4:
                    signal.set()
                time.sleep(step_s)
        except BaseException as exc:  # reported by the main thread
            errors.append((name, exc))

    first = threading.Thread(target=job, args=("first", 0.15, first_batches))
    first.start()
    assert first_batches.wait(60), errors
    late = threading.Thread(target=job, args=("late", 0.0, None))  # joins while the first is mid-epoch
    late.start()
    first.join(120)
    late.join(120)
    assert not errors, errors
    assert got["first"] == got["late"] == expected
    rows = read_audit(tmp_path / "late.jsonl")
    assert [r["batch"] for r in rows] == list(range(len(expected))) and {r["epoch"] for r in rows} == {0}
    # both jobs gone: the group leaves after its idle timeout, cleanly, and unregisters
    assert server.proc.wait(30) == 0
    assert not list((registry / "servers").glob("*.json"))
    assert "the last job has left" in server.log_path.read_text()


def test_the_idle_timeout_counts_only_once_a_consumer_came():
    idle = IdleExit(5.0)
    assert idle.verdict(False, 3600.0, 3600.0) is None  # a sweep's group starts before its jobs
    assert idle.verdict(True, -1.0, 3600.0) is None      # a consumer is connected
    assert idle.verdict(True, 4.0, 3600.0) is None
    code, reason = idle.verdict(True, 6.0, 3600.0)
    assert code == 0 and "idle_timeout=5s" in reason and "the last job has left" in reason
    assert IdleExit(5.0, connect_s=10).verdict(False, 11.0, 11.0)[0] == EXIT_NO_CONSUMER


@pytest.mark.parametrize("value", [0, -1.0, float("inf")])
def test_a_bad_idle_timeout_names_the_value(value):
    with pytest.raises(ConfigError, match=r"idle_timeout=.* must be > 0 seconds"):
        IdleExit(value)
