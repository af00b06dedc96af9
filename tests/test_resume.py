"""Spot stops: SIGTERM -> step finished, checkpoint written, data nodes shut down, exit 143;
a rerun with the same checkpoint dir resumes with no batch repeated or skipped."""
import json
import signal
import time
from pathlib import Path

import pytest
import torch

from data_service.errors import ConfigError
from dnn_worker.resume.state import VERSION
from hetero.local import EXIT_STOPPED, LocalJob, run_local
from launcher.train import checkpoint, faults
from launcher.train import trainer as trainer_mod
from launcher.config import LaunchConfig
from launcher.train.dnn_node import install_sigterm_handler, run_trainers
from launcher.train.trainer import TrainJob

from _launcher_helpers import FAST_HPS, SYNTHETIC_HPS, read_json, synth_data


def audit_batches(path: Path, epoch: int = 0) -> dict[int, list[int]]:
    """rank -> batch indices of ``epoch`` in the audit, in the order they were trained."""
    out: dict[int, list[int]] = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if entry["epoch"] == epoch:
            out.setdefault(entry["rank"], []).append(entry["batch"])
    return out


def logs_of(result) -> str:
    return "\n".join(f"== {p.name}\n" + p.read_text()[-4000:] for p in sorted((result.output / "logs").glob("*.log")))


# -- in-process: the real MNIST step, SIGTERM sent to this very process mid-step
@pytest.fixture
def sigterm_handler():
    previous = signal.getsignal(signal.SIGTERM)
    trainer_mod.STOP.clear()
    install_sigterm_handler()
    yield
    signal.signal(signal.SIGTERM, previous)
    trainer_mod.STOP.clear()


def inprocess_job(tmp_path: Path, **hps) -> TrainJob:
    cfg = LaunchConfig.from_hyperparameters({"pipeline_options": {"batch_size": 8, "blur_kernel": 3}, "loader_workers": 1,
                                             "evaluate": "", "log_every": 20, "audit_path": str(tmp_path / "audit.jsonl"),
                                             **hps})
    return TrainJob(cfg=cfg, mode="homogeneous", host="algo-1", dnn_hosts=("algo-1",), node_rank=0, nprocs=1,
                    master_addr="127.0.0.1", model_dir=str(tmp_path / "model"), output_dir=str(tmp_path / "out"),
                    checkpoint_dir=str(tmp_path / "ckpt"))


def test_sigterm_mid_step_checkpoints_then_resume_finishes_the_epoch(tmp_path, monkeypatch, sigterm_handler,
                                                                    fresh_forkserver):
    monkeypatch.setenv("SM_CHANNEL_TRAINING", str(synth_data(tmp_path / "data", 800, 0)))  # 100 batches of 8
    monkeypatch.setattr(faults, "SIGTERM_AT_STEP", 30)
    monkeypatch.setitem(faults._sigterm_calls, "n", 0)
    job = inprocess_job(tmp_path, step="launcher.train.faults:sigterm_step")

    assert run_trainers(job, 300) == EXIT_STOPPED
    ckpt = checkpoint.load(job.checkpoint_dir)
    assert ckpt["status"] == "stopped" and ckpt["steps"] == 30  # the step that got SIGTERM was finished
    assert ckpt["data"] == [{"version": VERSION, "epoch": 0, "seed": 0, "position": 30, "dp_rank": 0, "dp_size": 1}]
    assert ckpt["optimizer"]["state"], "optimizer state (Adadelta's running averages) is saved"
    saved = torch.load(Path(job.model_dir) / "model.pt")  # the stopped job's model artifact
    assert all(torch.equal(saved[k], ckpt["model"][k]) for k in saved)
    m = read_json(Path(job.output_dir) / "metrics.json")
    assert m["status"] == "stopped" and m["steps"] == 30
    assert m["checkpoint"] == checkpoint.checkpoint_path(job.checkpoint_dir)

    # resume: model, optimizer and position come back; the epoch completes with nothing repeated
    from examples.mnist import Net
    from dnn_worker import LocalDataset, ResumableLoader
    from data_service.contract.pipeline import PipelineSpec
    net = Net()
    opt = trainer_mod.make_optimizer(job.cfg, net.parameters())
    loader = ResumableLoader(torch.utils.data.DataLoader(LocalDataset(PipelineSpec(job.cfg.data.pipeline,
                                                                                    job.cfg.data.pipeline_options)),
                                                         batch_size=None))
    info = trainer_mod._resume(job, 0, net, opt, loader, loader.dataset.num_batches_per_epoch())
    assert info is not None and info.steps == 30 and loader.state_dict()["position"] == 30
    assert all(torch.equal(v, ckpt["model"][k]) for k, v in net.state_dict().items())

    trainer_mod.STOP.clear()
    monkeypatch.setattr(faults, "SIGTERM_AT_STEP", 10**9)
    assert run_trainers(job, 300) == 0
    m = read_json(Path(job.output_dir) / "metrics.json")
    assert m["status"] == "completed" and m["steps"] == 70 and m["resumed_from_steps"] == 30
    assert audit_batches(tmp_path / "audit.jsonl") == {0: list(range(100))}
    done = checkpoint.load(job.checkpoint_dir)
    assert done["status"] == "completed" and done["steps"] == 100 and done["data"][0]["epoch"] == 1

    # a finished checkpoint: nothing left to train, and the run says so
    assert run_trainers(job, 300) == 0
    assert read_json(Path(job.output_dir) / "metrics.json")["steps"] == 0
    assert audit_batches(tmp_path / "audit.jsonl") == {0: list(range(100))}


def failing_step(model, batch, optimizer, device) -> float:
    """A step that fails on the third batch, as a trainer bug would."""
    failing_step.calls = getattr(failing_step, "calls", 0) + 1
    if failing_step.calls >= 3:
        raise RuntimeError("injected step failure (test_resume:failing_step)")
    return 0.0


def test_a_failing_step_leaves_no_loader_worker_behind(tmp_path, monkeypatch, fresh_forkserver):
    # The launcher's loader workers ignore SIGTERM (a process-group SIGTERM must not kill them
    # mid-epoch). When a step raised, the failure's traceback held the loader wherever it was kept
    # (a log handler that keeps records, an error reporter, a test report), so its workers outlived
    # the run and the process hung at exit: multiprocessing terminates them (SIGTERM, ignored),
    # then joins them without a deadline. Seen as a hung test run.
    import logging
    import multiprocessing

    from launcher.train import dnn_node
    from launcher.train.dnn_node import EXIT_TRAINING_FAILED

    kept: list[logging.LogRecord] = []

    class KeepRecords(logging.Handler):
        def emit(self, record):
            kept.append(record)

    monkeypatch.setattr(dnn_node.log, "handlers", [*dnn_node.log.handlers, KeepRecords(logging.ERROR)])
    monkeypatch.setattr(failing_step, "calls", 0, raising=False)
    before = {p.pid for p in multiprocessing.active_children()}
    job = inprocess_job(tmp_path, step="test_resume:failing_step", pipeline="examples.synthetic:build_pipeline",
                        pipeline_options={"size": 64, "batch_size": 4})
    assert run_trainers(job, 300) == EXIT_TRAINING_FAILED
    assert any(r.exc_info for r in kept), "the failure's traceback is kept"
    # Checked while the forkserver runs (fixture): once it stops, a worker ends by itself.
    deadline = time.monotonic() + 15
    while (left := [p for p in multiprocessing.active_children()
                    if p.pid not in before and "ForkServerProcess" in type(p).__name__]) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    kept.clear()
    assert left == [], f"loader workers still running after the failed run: {left}"


def crash_at_step_12(model, batch, optimizer, device) -> float:
    """A step that fails on its 12th call: the process dies the way a hardware fault kills it."""
    crash_at_step_12.calls = getattr(crash_at_step_12, "calls", 0) + 1
    if crash_at_step_12.calls == 12:
        raise RuntimeError("injected crash (test_resume:crash_at_step_12)")
    return 0.0


def test_checkpoint_every_leaves_the_last_multiple_on_disk_when_a_step_crashes(tmp_path, monkeypatch,
                                                                              fresh_forkserver):
    from launcher.train.dnn_node import EXIT_TRAINING_FAILED

    monkeypatch.setattr(crash_at_step_12, "calls", 0, raising=False)
    job = inprocess_job(tmp_path, step="test_resume:crash_at_step_12", pipeline="examples.synthetic:build_pipeline",
                        pipeline_options={"size": 64, "batch_size": 4}, checkpoint_every=5)
    assert run_trainers(job, 300) == EXIT_TRAINING_FAILED
    ckpt = checkpoint.load(job.checkpoint_dir)  # no checkpoint on a crash: the step-10 one stays
    assert ckpt["steps"] == 10 and ckpt["data"][0]["position"] == 10


def test_a_checkpoint_of_another_job_is_refused_with_the_fix(tmp_path):
    states = [{"epoch": 0, "seed": 0, "position": 3, "dp_rank": r, "dp_size": 4} for r in range(4)]
    ckpt = {"world_size": 4, "seed": 0, "pipeline": "p:b", "pipeline_options": {}, "model_target": "m:N",
            "data": states}
    checkpoint.check_compatible(ckpt, "x", seed=0, pipeline="p:b", pipeline_options={}, model="m:N")
    with pytest.raises(ConfigError, match=r"seed=0 there, 1 here; pipeline='p:b' there, 'q:b' here.*same options"):
        checkpoint.check_compatible(ckpt, "x", seed=1, pipeline="q:b", pipeline_options={}, model="m:N")
    with pytest.raises(ConfigError, match=r"model_target='m:N' there, 'm:M' here"):
        checkpoint.check_compatible(ckpt, "x", seed=0, pipeline="p:b", pipeline_options={}, model="m:M")
    with pytest.raises(ConfigError, match=r"holds 3 data state\(s\) for world_size=4; it is damaged"):
        checkpoint.check_compatible({**ckpt, "data": states[:3]}, "x", seed=0, pipeline="p:b", pipeline_options={},
                                    model="m:N")
    (tmp_path / checkpoint.FILE_NAME).write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot be read.*delete it"):
        checkpoint.load(str(tmp_path))


# -- whole jobs: hetero local, SIGTERM from outside to the DNN node's launcher
def local_job(tmp_path: Path, name: str, ckpt: Path, audit: Path, hps: dict, **kw) -> LocalJob:
    return LocalJob(output=tmp_path / name, checkpoint_dir=ckpt, audit=audit, hyperparameters=hps,
                    timeout_s=300, echo=False, synth_train=64, synth_test=0, **kw)


@pytest.mark.slow  # test_sigterm_mid_step_checkpoints_then_resume_finishes_the_epoch and test_multinode.py cover it by default
def test_sigterm_stops_checkpoints_shuts_data_nodes_then_resume_with_fewer_data_nodes(tmp_path):
    ckpt, audit = tmp_path / "ckpt", tmp_path / "audit.jsonl"
    hps = {**SYNTHETIC_HPS, "pipeline.size": 1600, "emulate_step_s": 0.01, "log_every": 20, "warmup_steps": 2}
    start = time.monotonic()
    first = run_local(local_job(tmp_path, "run1", ckpt, audit, hps, data_nodes=2, sigterm_on=r"step 40:"))
    assert first.stopped, logs_of(first)
    assert first.exit_codes == {"algo-1": EXIT_STOPPED, "algo-2": 0, "algo-3": 0}, logs_of(first)
    assert time.monotonic() - start < 120  # the data nodes were shut down, not killed after the runner's grace
    for host in ("algo-2", "algo-3"):
        assert read_json(first.output / host / "output" / "data_node.json")["reason"] == "shut down"
        assert "training stopped by SIGTERM on algo-1" in (first.output / "logs" / f"{host}.log").read_text()
    saved = checkpoint.load(str(ckpt))
    position = saved["data"][0]["position"]
    assert saved["status"] == "stopped" and saved["data"][0]["epoch"] == 0 and 40 <= position < 200, saved["data"]
    assert first.metrics["status"] == "stopped" and first.metrics["steps"] == position
    assert audit_batches(audit) == {0: list(range(position))}

    second = run_local(local_job(tmp_path, "run2", ckpt, audit, hps, data_nodes=1))
    assert second.ok, logs_of(second)
    m = second.metrics
    assert m["status"] == "completed" and m["resumed_from_steps"] == position and m["steps"] == 200 - position
    assert [n["batches_sent"] for n in m["nodes"] if n["role"] == "data"] == [200 - position]
    assert audit_batches(audit) == {0: list(range(200))}  # every batch exactly once across both runs
    assert "resuming from" in (second.output / "logs" / "algo-1.log").read_text()


@pytest.mark.slow
def test_ddp_ranks_stop_at_the_same_step_and_resume_exactly(tmp_path):
    ckpt, audit = tmp_path / "ckpt", tmp_path / "audit.jsonl"
    hps = {**SYNTHETIC_HPS, "pipeline.size": 1600, "emulate_step_s": 0.01, "log_every": 20, "procs_per_node": 2,
           "loader_workers": 0}
    first = run_local(local_job(tmp_path, "run1", ckpt, audit, hps, data_nodes=1, dnn_nodes=2,
                                sigterm_on=r"rank 0 INFO launcher.train.step_stats: step 20:"))
    assert first.stopped and first.exit_codes["algo-1"] == first.exit_codes["algo-2"] == EXIT_STOPPED, logs_of(first)
    saved = checkpoint.load(str(ckpt))
    positions = {s["dp_rank"]: s["position"] for s in saved["data"]}
    assert len(set(positions.values())) == 1 and saved["world_size"] == 4, positions  # one step for all
    second = run_local(local_job(tmp_path, "run2", ckpt, audit, hps, data_nodes=2, dnn_nodes=2))
    assert second.ok, logs_of(second)
    batches = audit_batches(audit)
    assert sorted(batches) == [0, 1, 2, 3]
    assert sorted(b for r in batches.values() for b in r) == list(range(200))
    assert all(len(r) == 50 == len(set(r)) for r in batches.values())


@pytest.mark.slow
def test_mnist_job_sigterm_and_resume_with_the_real_step(tmp_path):
    ckpt, audit = tmp_path / "ckpt", tmp_path / "audit.jsonl"
    data = synth_data(tmp_path / "data", train=1600, test=400)
    hps = {**FAST_HPS, "log_every": 20}
    first = run_local(LocalJob(data=data, output=tmp_path / "run1", checkpoint_dir=ckpt, audit=audit,
                               hyperparameters=hps, timeout_s=300, echo=False, sigterm_on=r"step 60:"))
    assert first.stopped, logs_of(first)
    position = checkpoint.load(str(ckpt))["data"][0]["position"]
    second = run_local(LocalJob(data=data, output=tmp_path / "run2", checkpoint_dir=ckpt, audit=audit, data_nodes=2,
                                hyperparameters=hps, timeout_s=300, echo=False))
    assert second.ok, logs_of(second)
    assert second.metrics["steps"] == 200 - position and second.metrics["test_accuracy"] > 0.2
    assert audit_batches(audit) == {0: list(range(200))}
