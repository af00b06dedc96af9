"""DDP's collective backend (``ddp_backend``): the choice, the errors at start where a machine
cannot run it, smddp imported only when chosen, and a one-rank launcher run over the chosen backend
(gloo here; nccl on a GPU)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from data_service.errors import ConfigError
from dnn_worker.device.ddp import SMDDP_MODULE, resolve_backend
from hetero.ports import free_port
from launcher.config import LaunchConfig
from launcher.job.preflight import preflight

from _launcher_helpers import SYNTHETIC_HPS, read_json, synth_data

CUDA = torch.cuda.is_available()


def test_auto_is_nccl_with_cuda_else_gloo():
    assert resolve_backend("auto", cuda=True) == "nccl"
    assert resolve_backend("auto", cuda=False) == "gloo"
    assert resolve_backend("gloo", cuda=False) == "gloo"
    assert LaunchConfig().dnn.ddp_backend == "auto"


def test_unknown_backend_is_an_error_when_the_options_are_read():
    with pytest.raises(ConfigError, match=r"ddp_backend='mpi' must be one of auto, nccl, gloo, smddp"):
        LaunchConfig.from_hyperparameters({"ddp_backend": "mpi"})
    with pytest.raises(ConfigError, match=r"ddp_backend='NCCL' must be one of"):
        resolve_backend("NCCL")
    assert LaunchConfig.from_hyperparameters({"ddp_backend": "smddp"}).dnn.ddp_backend == "smddp"  # checked at start


def test_nccl_without_cuda_names_the_fix():
    with pytest.raises(ConfigError, match=r"ddp_backend='nccl' needs CUDA GPUs.*use ddp_backend=gloo or auto"):
        resolve_backend("nccl", cuda=False)


def test_smddp_without_its_library_is_a_clear_error():
    try:
        __import__(SMDDP_MODULE)
        pytest.skip("SageMaker's data parallel library is installed")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match=r"ddp_backend='smddp' needs SageMaker's distributed data parallel "
                                          r"library \(smdistributed.*use ddp_backend=nccl or auto elsewhere"):
        resolve_backend("smddp", cuda=True)


@pytest.fixture
def fake_smddp(tmp_path, monkeypatch):
    """A stand-in ``smdistributed.dataparallel.torch.torch_smddp`` that records its import."""
    pkg = tmp_path / "smdistributed" / "dataparallel" / "torch"
    pkg.mkdir(parents=True)
    for folder in (pkg.parent.parent, pkg.parent, pkg):
        (folder / "__init__.py").write_text("")
    (pkg / "torch_smddp.py").write_text("import builtins\nbuiltins._smddp_imported = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("smdistributed")]:
        monkeypatch.delitem(sys.modules, name)
    import builtins
    monkeypatch.setattr(builtins, "_smddp_imported", False, raising=False)
    yield builtins
    for name in [m for m in sys.modules if m.startswith("smdistributed")]:
        del sys.modules[name]


def test_smddp_is_imported_only_when_chosen(fake_smddp):
    for choice in ("auto", "gloo"):
        resolve_backend(choice, cuda=False)
    assert fake_smddp._smddp_imported is False and SMDDP_MODULE not in sys.modules
    assert resolve_backend("smddp", cuda=True) == "smddp"
    assert fake_smddp._smddp_imported is True
    with pytest.raises(ConfigError, match=r"ddp_backend='smddp' needs CUDA GPUs"):
        resolve_backend("smddp", cuda=False)


@pytest.mark.skipif(CUDA, reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("role, fails", [("dnn", True), ("homogeneous", True), ("data", False)])
def test_preflight_fails_at_start_on_nodes_that_train(role, fails):
    cfg = LaunchConfig.from_hyperparameters({**SYNTHETIC_HPS, "model": "torch.nn:Identity", "step": "torch:add",
                                             "evaluate": "", "ddp_backend": "nccl"})
    if fails:
        with pytest.raises(ConfigError, match="ddp_backend='nccl' needs CUDA GPUs"):
            preflight(cfg, role)
    else:
        preflight(cfg, role)  # a data node does not train: its backend is not its concern


def one_rank_job(tmp_path: Path, backend: str, **hps):
    from launcher.train.trainer import TrainJob

    cfg = LaunchConfig.from_hyperparameters({"pipeline_options": {"batch_size": 8, "blur_kernel": 3}, "loader_workers": 0,
                                             "evaluate": "", "max_steps": 3, "warmup_steps": 1, "checkpoint": False,
                                             "master_port": free_port(), "ddp_backend": backend, **hps})
    return TrainJob(cfg=cfg, mode="homogeneous", host="algo-1", dnn_hosts=("algo-1",), node_rank=0, nprocs=1,
                    master_addr="127.0.0.1", model_dir=str(tmp_path / "model"), output_dir=str(tmp_path / "out"))


@pytest.mark.parametrize("backend, expected", [("gloo", "gloo"), ("auto", None)])
def test_one_rank_trains_over_the_chosen_backend(tmp_path, monkeypatch, backend, expected):
    """A chosen backend runs even on one rank (DDP over one device); ``auto`` keeps a lone rank
    without a process group."""
    from launcher.train import trainer

    monkeypatch.setenv("SM_CHANNEL_TRAINING", str(synth_data(tmp_path / "data", 64, 0)))
    wrapped = []
    real_ddp = torch.nn.parallel.DistributedDataParallel
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel",
                        lambda *a, **k: wrapped.append(1) or real_ddp(*a, **k))
    summary = trainer.train(0, one_rank_job(tmp_path, backend))
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert read_json(tmp_path / "out" / "metrics.json")["ddp_backend"] == expected
    assert wrapped == ([1] if expected else [])
    assert not dist.is_initialized()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_one_gpu_dnn_node_trains_with_nccl(tmp_path):
    """The launcher's DNN node (beside one data node, as ``hetero local`` runs them) on one GPU, DDP over NCCL."""
    from hetero.local import LocalJob, run_local

    hps = {"pipeline.batch_size": 32, "pipeline.blur_kernel": 3, "data_workers": 1, "procs_per_node": 1,
           "max_steps": 20, "ddp_backend": "nccl", "evaluate": "", "checkpoint": False}
    result = run_local(LocalJob(output=tmp_path / "run", hyperparameters=hps, timeout_s=300, echo=False,
                                synth_train=1024, synth_test=0))
    logs = "\n".join(p.read_text()[-3000:] for p in sorted((result.output / "logs").glob("*.log")))
    assert result.ok, logs
    m = result.metrics
    assert m["ddp_backend"] == "nccl" and m["world_size"] == 1 and m["status"] == "completed" and m["steps"] == 20
    assert "DDP process group: backend nccl, 1 rank(s)" in logs


def test_lightning_datamodule_trains_under_the_strategy_for_gloo(server_factory, tmp_path):
    """``lightning_strategy("gloo")``: Lightning's DDPStrategy over gloo, with the RemoteDataModule
    on one CPU rank; every batch of both epochs trained once, in the order of the reference."""
    pytest.importorskip("lightning")
    import _lightning_job as job
    from test_lightning import OPTS, audit, reference

    from dnn_worker.device.ddp import lightning_strategy

    strategy = lightning_strategy("gloo")
    assert type(strategy).__name__ == "DDPStrategy"
    server = server_factory(OPTS, num_workers=1)
    log = tmp_path / "audit.jsonl"
    try:
        assert job.fit(server.address, str(log), str(tmp_path), 0, strategy=strategy) == len(reference())
        assert dist.get_backend() == "gloo"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert audit(log) == reference()
