"""The container images and the compose job (docs/containers.md).

* Cheap checks, run everywhere: the committed docker-compose.yml and docker/job/ are what
  docker/make-config.py writes; the generated configs are read by the launcher's own
  ``load_env`` and give the roles the compose file promises; the entrypoint's argument handling.
* ``test_compose_job`` (marker ``containers``): runs docker-compose.yml with podman-compose:
  two data-node containers and a DNN-node container on a compose network where algo-1..3
  resolve. It checks that every container exits 0, the DNN node trained and wrote its model
  and metrics, and each data node served batches and stopped on the DNN node's authenticated
  shutdown. It mounts this working tree over /opt/ml/code, so it tests the current code with
  the images' dependencies, and passes hyperparameters on the command line (48 steps, one worker
  per data server) to stay short.

The images are not built here (two ~6 GB images take ~10 min on a 2-core machine): build them
with ``bash scripts/build-images.sh``. The test skips, saying why, when podman or podman-compose
is missing, when an image is absent, or when an image was built from other dependency files
(its ``hetero.deps`` label) than this tree's.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.config import LaunchConfig
from launcher.job.roles import plan_roles
from launcher.job.sm_env import load_env

REPO = Path(__file__).resolve().parents[1]
DATA_IMAGE = os.environ.get("HETERO_DATA_IMAGE", "localhost/hetero-data:latest")
DNN_IMAGE = os.environ.get("HETERO_DNN_IMAGE", "localhost/hetero-dnn:latest")
COMPOSE_TIMEOUT_S = 540  # 1-4 min on a 2-core machine, depending on other load
# Hyperparameters given on the command line (as `docker run IMAGE train --key value` would)
# override hyperparameters.json: fewer steps and one worker per data server keep the test short.
STEPS = 48
TEST_ARGS = ["train", "--max_steps", str(STEPS), "--data_workers", "1"]


def _make_config(tmp_path: Path, *args: str) -> tuple[Path, Path]:
    config_dir, compose = tmp_path / "job", tmp_path / "compose.yml"
    subprocess.run([sys.executable, str(REPO / "docker" / "make-config.py"), "--config-dir", str(config_dir),
                    "--compose", str(compose), "--gpu-override", str(tmp_path / "gpu.yml"), *args],
                   check=True, capture_output=True, text=True)
    return config_dir, compose


def test_committed_compose_and_configs_are_current(tmp_path):
    config_dir, compose = _make_config(tmp_path)
    committed = (REPO / "docker-compose.yml").read_text()
    assert compose.read_text().replace("./job/", "./docker/job/") == committed, \
        "docker-compose.yml is stale: run python docker/make-config.py"
    assert (tmp_path / "gpu.yml").read_text() == (REPO / "docker" / "compose.gpu.yml").read_text()
    for path in sorted(config_dir.rglob("*.json")):
        mine = REPO / "docker" / "job" / path.relative_to(config_dir)
        assert mine.is_file() and mine.read_text() == path.read_text(), \
            f"{mine} is stale or missing: run python docker/make-config.py"


@pytest.mark.parametrize("data_nodes,dnn_nodes", [(2, 1), (1, 1), (3, 2)])
def test_generated_configs_give_the_promised_roles(tmp_path, data_nodes, dnn_nodes):
    config_dir, _ = _make_config(tmp_path, "--data-nodes", str(data_nodes), "--dnn-nodes", str(dnn_nodes))
    hosts = sorted(p.name for p in config_dir.iterdir())
    assert len(hosts) == data_nodes + dnn_nodes
    roles = {}
    for host in hosts:
        root = tmp_path / "root" / host
        (root / "input").mkdir(parents=True)
        shutil.copytree(config_dir / host / "config", root / "input" / "config")
        env = load_env(root, environ={})  # the files alone, as in a bare SageMaker container
        assert env.current_host == host
        plan = plan_roles(env, LaunchConfig.from_hyperparameters(env.hyperparameters))
        roles[host] = plan.role
        assert len(plan.data_hosts) == data_nodes and len(plan.dnn_hosts) == dnn_nodes
    assert sorted(roles.values()) == sorted(["data"] * data_nodes + ["dnn"] * dnn_nodes)
    assert roles["algo-1"] == "data"  # interleaved: the DNN node is not algo-1


def test_entrypoint_arguments(tmp_path):
    entry = REPO / "docker" / "entrypoint.sh"
    run = subprocess.run(["sh", str(entry), "echo", "hello"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == "hello\n"
    run = subprocess.run(["sh", str(entry), "serve"], capture_output=True, text=True)
    assert run.returncode == 2 and "no inference server" in run.stderr
    # `train`, nothing, or bare hyperparameters run the launcher with the hyperparameters; a
    # stand-in `python` records its arguments (the launcher itself is tested elsewhere).
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "python").write_text('#!/bin/sh\necho "python $*"\n')
    (fake_bin / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "HETERO_"))}
    env["PATH"] = f"{fake_bin}:{env['PATH']}"
    launcher = "python /opt/ml/code/launcher/entry.py"
    for argv, expect in ((["train"], launcher), ([], launcher), (["train", "--epochs", "2"], launcher + " --epochs 2"),
                         (["--max_steps", "5"], launcher + " --max_steps 5")):
        run = subprocess.run(["sh", str(entry), *argv], capture_output=True, text=True, env=env)
        assert run.returncode == 0 and run.stdout == expect + "\n", (argv, run.stdout, run.stderr)
    # local runs: synthetic data first, into the training channel, when it holds no MNIST files
    channel = tmp_path / "training"
    env.update(HETERO_SYNTH_TRAIN="16", HETERO_SYNTH_TEST="4", SM_CHANNEL_TRAINING=str(channel))
    run = subprocess.run(["sh", str(entry), "train"], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "writing synthetic MNIST (16 train, 4 test images)" in run.stdout
    assert "write_synthetic" in run.stdout and str(channel) in run.stdout
    channel.mkdir()
    (channel / "train-images-idx3-ubyte").write_bytes(b"")
    run = subprocess.run(["sh", str(entry), "train"], capture_output=True, text=True, env=env)
    assert run.stdout == launcher + "\n"


# --------------------------------------------------------------------------- the compose job

def _deps_hash() -> str:
    h = hashlib.sha256()
    for name in ("requirements/torch.txt", "pyproject.toml", "docker/install-deps.sh"):
        h.update((REPO / name).read_bytes())
    return h.hexdigest()[:16]


def _podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def _skip_reason() -> str | None:
    if not shutil.which("podman"):
        return "podman is not installed (apt-get install podman; see docs/containers.md)"
    if not shutil.which("podman-compose"):
        return "podman-compose is not installed (apt-get install podman-compose; see docs/containers.md)"
    info = _podman("info", "--format", "{{.Host.OCIRuntime.Name}}")
    if info.returncode != 0:
        return f"podman does not work here: {info.stderr.strip()[-300:]}"
    want = _deps_hash()
    for image in (DATA_IMAGE, DNN_IMAGE):
        got = _podman("image", "inspect", image, "--format", '{{index .Labels "hetero.deps"}}')
        if got.returncode != 0:
            return f"image {image} is absent: build it with `bash scripts/build-images.sh` (~10 min, not part of tests)"
        if got.stdout.strip() != want:
            return (f"image {image} was built from other dependency files (label hetero.deps="
                    f"{got.stdout.strip()!r}, this tree {want!r}): rebuild with `bash scripts/build-images.sh`")
    return None


def _compose_file(tmp_path: Path) -> Path:
    """The committed compose file with the config path made absolute, this tree at /opt/ml/code
    and TEST_ARGS as the command."""
    text = (REPO / "docker-compose.yml").read_text().replace("./docker/job/", f"{REPO}/docker/job/")
    assert text.count('    command: ["train"]\n') == 3
    text = text.replace('    command: ["train"]\n', f"    command: {json.dumps(TEST_ARGS)}\n")
    mount = f"      - {REPO}:/opt/ml/code:ro\n"
    text = text.replace("    volumes:\n", "    volumes:\n" + mount)
    path = tmp_path / "docker-compose.yml"
    path.write_text(text)
    return path


def _read(path: Path) -> dict:
    assert path.is_file(), f"{path} was not written"
    return json.loads(path.read_text())


@pytest.mark.containers
@pytest.mark.timeout(COMPOSE_TIMEOUT_S + 150)
def test_compose_job(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    project = f"hetero-test-{os.getpid()}"
    out = tmp_path / "out"
    hosts = {"algo-1": "data", "algo-2": "dnn", "algo-3": "data"}
    for host in hosts:  # podman does not create missing bind-mount sources
        (out / host / "model").mkdir(parents=True)
        (out / host / "output").mkdir(parents=True)
    compose = _compose_file(tmp_path)
    env = {**os.environ, "HETERO_COMPOSE_OUT": str(out), "TRAINING_JOB_NAME": project,
           "HETERO_JOB_SECRET": os.urandom(8).hex(), "HETERO_DATA_IMAGE": DATA_IMAGE, "HETERO_DNN_IMAGE": DNN_IMAGE}
    env = {k: v for k, v in env.items() if not (k.startswith("SM_") or k == "HETERO_HOST_MAP")}
    log_path = tmp_path / "compose.log"
    started = time.monotonic()
    try:
        with open(log_path, "w") as log:
            try:
                subprocess.run(["podman-compose", "-p", project, "-f", str(compose), "up"], cwd=tmp_path, env=env,
                               stdout=log, stderr=subprocess.STDOUT, timeout=COMPOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"compose job still running after {COMPOSE_TIMEOUT_S} s; log tail:\n"
                            + log_path.read_text()[-4000:])
        elapsed = time.monotonic() - started
        log_text = log_path.read_text()
        codes = {}
        for host in hosts:
            got = _podman("inspect", f"{project}_{host}_1", "--format", "{{.State.Status}} {{.State.ExitCode}}")
            assert got.returncode == 0, f"no container for {host}: {got.stderr}\n{log_text[-4000:]}"
            codes[host] = got.stdout.split()
    finally:
        subprocess.run(["podman-compose", "-p", project, "-f", str(compose), "down"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=120)
        _podman("network", "rm", "-f", f"{project}_default")
    assert codes == {h: ["exited", "0"] for h in hosts}, f"container states {codes}; log tail:\n{log_text[-4000:]}"

    metrics = _read(out / "algo-2" / "output" / "data" / "metrics.json")
    assert metrics["mode"] == "heterogeneous" and metrics["step_kind"] == "real", metrics
    assert metrics["steps"] == STEPS and metrics["world_size"] == 1
    assert metrics["job_name"] == project
    assert sorted(metrics["data_hosts"]) == ["algo-1", "algo-3"] and metrics["dnn_hosts"] == ["algo-2"]
    served = {n["host"]: n for n in metrics["nodes"] if n.get("role") == "data"}
    assert set(served) == {"algo-1", "algo-3"}, metrics["nodes"]
    assert all(n["address"].split(":")[0] in ("algo-1", "algo-3") for n in served.values()), served
    assert sum(n["batches_sent"] for n in served.values()) >= STEPS
    assert all(n["workers"] == 1 for n in served.values()), served
    assert (out / "algo-2" / "model" / "model.pt").stat().st_size > 10_000
    for host in ("algo-1", "algo-3"):
        report = _read(out / host / "output" / "data" / "data_node.json")
        assert report["exit_code"] == 0 and report["reason"] == "shut down", report
        assert report["batches_sent"] > 0
    print(f"compose job: {elapsed:.0f} s, avg step {metrics['avg_step_time_s']:.4f} s, "
          f"data wait {metrics['data_wait_fraction']:.0%}")
