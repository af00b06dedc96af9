"""`hetero local` on `hetero prepare`'s shards, as the commands are printed and documented: in S3
(moto) with the image model's own evaluation, and in a local folder named by a relative path."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero.cli import main
from hetero.local import local_paths, reads_mnist

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "my-bucket"
IMAGE_JOB = ["--hp", "pipeline=data_service.pipelines.images:build_pipeline",
             "--hp", "model=examples.imagefolder:resnet18", "--hp", "step=examples.imagefolder:train_step"]
# keeps a job short on two cores: small crops and batches, five steps (3 batches an epoch), one builder each
QUICK = ["--hp", "max_steps=5", "--hp", "pipeline.image_size=32", "--hp", "pipeline.batch_size=8",
         "--hp", "data_workers=1", "--hp", "loader_workers=1", "--epochs", "2", "--quiet", "--timeout", "240"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from hetero.synthetic.images import write_image_folder

    root = tmp_path_factory.mktemp("images") / "imgs"
    write_image_folder(root, per_class=8, classes=3, seed=2, min_side=40, max_side=64)
    return root


def hetero_local(args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "hetero", "local", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=400, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_prepare_suggests_an_absolute_path_for_a_local_destination(images, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["prepare", str(images), "localdest", "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"--hp pipeline.shards={tmp_path / 'localdest'}\n" in out, out
    assert (tmp_path / "localdest" / "index.bin").is_file()


def test_relative_local_paths_of_plug_in_options_are_made_absolute(tmp_path):
    hps = {"pipeline.shards": "shards", "model.shards": "./shards", "pipeline.cache_dir": "~/c",
           "pipeline.index": "/abs/index", "model.data_dir": "s3://bucket/x", "pipeline.batch_size": "8",
           "pipeline_options": json.dumps({"root": "data", "decode": "fused"}), "model_options": {"num_classes": 3},
           "epochs": 2}
    got = local_paths(hps, tmp_path)
    assert got["pipeline.shards"] == got["model.shards"] == str(tmp_path / "shards")
    assert got["pipeline.cache_dir"] == str(Path("~/c").expanduser())
    assert got["pipeline.index"] == "/abs/index" and got["model.data_dir"] == "s3://bucket/x"
    assert got["pipeline.batch_size"] == "8" and got["epochs"] == 2 and got["model_options"] == {"num_classes": 3}
    assert json.loads(got["pipeline_options"]) == {"root": str(tmp_path / "data"), "decode": "fused"}


@pytest.mark.parametrize("hps, mnist", [
    ({}, True),                                                                   # the default job
    ({"pipeline": "examples.synthetic:build_pipeline"}, True),                    # MNIST's Net evaluates on t10k
    ({"pipeline": "data_service.pipelines.images:build_pipeline", "model": "examples.imagefolder:resnet18"}, False),
    ({"pipeline": "data_service.pipelines.images:build_pipeline", "model": "examples.imagefolder:resnet18",
      "evaluate": "examples.mnist:evaluate"}, True),
    ({"pipeline": "examples.synthetic:build_pipeline", "evaluate": ""}, False),
])
def test_synthetic_mnist_only_for_a_job_that_reads_it(hps, mnist):
    assert reads_mnist(hps) is mnist


@pytest.mark.slow  # a whole local job: two data nodes and a trainer, about 40 s
def test_the_s3_command_line_trains_evaluates_with_the_models_own_evaluation_and_writes_metrics(images, tmp_path):
    from data_service.prepare.writer import prepare
    from _s3_env import s3_with_bucket

    with s3_with_bucket(BUCKET):
        url = f"s3://{BUCKET}/train"
        prepare(str(images), url, workers=1, progress=False)
        proc = hetero_local(["--data-nodes", "2", IMAGE_JOB[0], IMAGE_JOB[1], "--hp", f"pipeline.shards={url}",
                             IMAGE_JOB[2], IMAGE_JOB[3], "--hp", f"model.shards={url}", *IMAGE_JOB[4:], *QUICK,
                             "--output", str(tmp_path / "out")], tmp_path)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "out" / "logs").glob("*.log")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["steps"] == 5 and metrics["test_accuracy"] is None  # shards, no validation channel: skipped
    assert "evaluate examples.imagefolder:evaluate (it found no evaluation data" in logs
    assert "examples.mnist" not in logs and "synthetic MNIST" not in proc.stderr + proc.stdout
    assert "avg step time: none measured (all 5 steps were warm-up, warmup_steps=5" in proc.stdout


@pytest.mark.slow  # a whole local job, about 30 s
def test_a_relative_local_shards_path_names_the_folder_where_hetero_local_runs(images, tmp_path):
    from data_service.prepare.writer import prepare

    prepare(str(images), str(tmp_path / "localdest"), workers=1, progress=False)
    proc = hetero_local([*IMAGE_JOB, "--hp", "pipeline.shards=localdest", "--hp", "model.shards=localdest",
                         *QUICK, "--hp", "warmup_steps=1", "--output", "out"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["steps"] == 5 and metrics["avg_step_time_s"] > 0
    assert metrics["pipeline_options"]["shards"] == str(tmp_path / "localdest")
