"""hetero prepare as a SageMaker job: the request passes botocore's model and the API's rules; in the
container each host writes its part and the first host merges (an emulated /opt/ml, real prepare)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from data_service.shards.indexfile import read_index
from data_service.prepare.writer import prepare
from hetero.sagemaker.prepare_job import ENTRY, prepare_request, prepare_spec, run_part
from hetero.sagemaker.spec import SubmitError
from _noise_source import make

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"


def _spec(**kw):
    args = dict(instance_type="ml.c5.9xlarge", count=4, role=ROLE, image=IMAGE, output="s3://bkt/out", region="us-east-1",
                job_name="hetero-prepare-1", source_s3="s3://bkt/src/sourcedir.tar.gz")
    args.update(kw)
    return prepare_spec("s3://bkt/imagenet/train", "s3://bkt/shards/train", **args)


def test_the_request_runs_the_entry_on_n_instances_and_passes_botocore_s_model():
    request = prepare_request(_spec())
    assert request["ResourceConfig"]["InstanceType"] == "ml.c5.9xlarge"
    assert request["ResourceConfig"]["InstanceCount"] == 4
    assert request["HyperParameters"]["sagemaker_program"] == ENTRY and Path(ENTRY).exists()
    assert request["HyperParameters"]["dest"] == "s3://bkt/shards/train"
    (channel,) = request["InputDataConfig"]
    assert channel["InputMode"] == "FastFile" and channel["ChannelName"] == "source"
    assert not request["Environment"]


def test_a_bad_request_is_refused_before_anything_is_sent():
    with pytest.raises(SubmitError, match="ml.c5.9xlrage"):
        prepare_request(_spec(instance_type="ml.c5.9xlrage"))
    with pytest.raises(SubmitError, match="--sagemaker"):
        _spec(count=0)
    with pytest.raises(SubmitError, match="DEST"):
        prepare_spec("s3://bkt/x", "/local", instance_type="ml.c5.xlarge", count=1, role=ROLE, image=IMAGE,
                     output="s3://bkt/o", region="us-east-1", job_name="j", source_s3="s3://bkt/s.tar.gz")


def _host(root: Path, host: str, hosts: list[str], src: Path, dest: Path) -> Path:
    config = root / host / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({"current_host": host, "hosts": hosts}))
    (config / "hyperparameters.json").write_text(json.dumps(
        {"dest": str(dest), "shard_size": "1000000", "max_side": "0", "shuffle_seed": "0", "merge_wait_s": "60",
         "workers": "1", "merge_poll_s": "0.2"}))
    (root / host / "input" / "data").mkdir(parents=True)
    (root / host / "input" / "data" / "source").symlink_to(src)
    return root / host


def test_each_host_writes_its_part_and_the_first_merges_into_the_single_run_index(tmp_path):
    src = tmp_path / "images"
    data = make(48, 256)
    for i in range(len(data)):
        body, label = data[i]
        (src / f"c{label}").mkdir(parents=True, exist_ok=True)
        (src / f"c{label}" / f"{i:03d}.jpg").write_bytes(body)
    dest, hosts = tmp_path / "dest", ["algo-1", "algo-2"]
    roots = {h: _host(tmp_path / "ml", h, hosts, src, dest) for h in hosts}
    first = threading.Thread(target=run_part, args=(str(roots["algo-1"]), {}))
    first.start()  # waits for algo-2's part, then merges
    assert run_part(str(roots["algo-2"]), {}) == 0
    first.join(60)
    assert not first.is_alive()
    single = tmp_path / "single"
    prepare(str(src), str(single), shard_size=1_000_000, workers=1, progress=False)
    a, b = read_index(str(single)), read_index(str(dest))
    assert len(a.shards) >= 2 and list(a.shards) == list(b.shards) and a.id == b.id
    assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.labels, b.labels)
    assert all((single / s.name).read_bytes() == (dest / s.name).read_bytes() for s in a.shards)


def test_hetero_prepare_sagemaker_dry_run_prints_the_checked_request(capsys):
    from hetero.cli import main

    base = ["prepare", "s3://bkt/imagenet/train", "s3://bkt/shards/train", "--sagemaker", "3", "--instance-type",
            "ml.c5.9xlarge", "--output", "s3://bkt/out", "--region", "us-east-1", "--image", IMAGE,
            "--shard-size", "128MB", "--dry-run"]
    assert main([*base, "--role", ROLE]) == 0
    request = json.loads(capsys.readouterr().out)
    assert request["ResourceConfig"]["InstanceCount"] == 3
    assert request["HyperParameters"]["shard_size"] == "128000000"
    assert request["HyperParameters"]["sagemaker_submit_directory"].endswith("/source/sourcedir.tar.gz")
    assert main(base) == 2 and "needs --role" in "".join(capsys.readouterr())
