"""Emulated SageMaker nodes on one machine: an /opt/ml-like tree and variables per node.

Each node gets what a SageMaker training container would: ``input/config/resourceconfig.json``
(the hosts and instance groups), ``input/config/hyperparameters.json`` (written the SDK v2 way,
every value JSON-encoded), ``input/data/training`` (the data channel), ``model/`` and
``output/data/``, plus the ``SM_*`` variables of the training toolkit. Host names
``algo-1..n`` resolve to 127.0.0.1 through ``HETERO_HOST_MAP``, each with its own free port.
The DNN group takes the first host names: nothing may assume which algo-N is a data node.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from data_service.errors import ConfigError
from hetero.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_GROUP, DNN_GROUP, HOMOGENEOUS_GROUP = "data_group", "dnn_group", "homogeneousCluster"


def as_hyperparameters(values: Mapping[str, Any]) -> dict[str, str]:
    """``values`` as SageMaker passes hyperparameters, the one form a local job's take, alone or in a
    sweep: every value a string, a number, flag, list or object as its JSON (``3`` -> ``"3"``,
    ``True`` -> ``"true"``), a string as it is."""
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


@dataclass
class Node:
    """One emulated node: its host name, group, role label, /opt/ml root and variables."""

    host: str
    group: str
    role: str
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    cpus: set[int] | None = None

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output" / "data"


def parse_cpus(text: str | None) -> set[int] | None:
    """``"0"``, ``"0,2"`` or ``"1-3"`` -> a CPU set; None/"" -> no pinning."""
    if not text:
        return None
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ConfigError(f"CPU list {text!r} must look like '0', '0,2' or '1-3'") from None
    usable = os.sched_getaffinity(0)
    if not cpus <= usable:
        raise ConfigError(f"CPU list {text!r} names CPUs {sorted(cpus - usable)} this machine does not offer "
                          f"(usable: {sorted(usable)})")
    return cpus


def build_nodes(work: Path, data_nodes: int, dnn_nodes: int, homogeneous: bool, data_dir: Path,
                hyperparameters: Mapping[str, Any], job_name: str, data_cpus: set[int] | None = None,
                dnn_cpus: set[int] | None = None, checkpoint_dir: Path | None = None,
                env: dict[str, str] | None = None) -> list[Node]:
    """Write every node's tree under ``work`` and return the nodes (DNN hosts first).

    ``env``: variables added to every node's environment (``HETERO_JOB_TOKEN`` for a registry).

    ``checkpoint_dir``: one folder every node uses as its checkpoint dir (``HETERO_CHECKPOINT_DIR``),
    kept across runs; None: each node's ``<root>/checkpoints``, gone with the tree.
    """
    if dnn_nodes < 1:
        raise ConfigError(f"--dnn-nodes {dnn_nodes}: a job needs at least one DNN node")
    if not homogeneous and data_nodes < 1:
        raise ConfigError(f"--data-nodes {data_nodes}: a heterogeneous job needs at least one data node "
                          "(or pass --homogeneous)")
    layout = ([(HOMOGENEOUS_GROUP, "homogeneous", dnn_nodes)] if homogeneous
              else [(DNN_GROUP, "dnn", dnn_nodes), (DATA_GROUP, "data", data_nodes)])
    return write_nodes(work, layout, data_dir, hyperparameters, job_name, data_cpus, dnn_cpus, checkpoint_dir,
                       env, secrets.token_hex(16))


def write_nodes(work: Path, layout: list[tuple[str, str, int]], data_dir: Path, hyperparameters: Mapping[str, Any],
                job_name: str, data_cpus: set[int] | None, dnn_cpus: set[int] | None,
                checkpoint_dir: Path | None, env: dict[str, str] | None, secret: str) -> list[Node]:
    """The nodes of one job of ``layout``'s instance groups, ``(group, role, count)`` each, with
    job secret ``secret`` (jobs that share a data group share it: a sweep)."""
    nodes: list[Node] = []
    groups = []
    for group, role, count in layout:
        hosts = [f"algo-{len(nodes) + i + 1}" for i in range(count)]
        groups.append({"instance_group_name": group, "instance_type": "ml.local", "hosts": hosts})
        nodes += [Node(h, group, role, work / h / "opt" / "ml", cpus=dnn_cpus if role != "data" else data_cpus)
                  for h in hosts]
    all_hosts = [n.host for n in nodes]
    host_map = {n.host: f"127.0.0.1:{free_port()}" for n in nodes}
    hps = {"bind_host": "127.0.0.1", "master_port": str(free_port()), **as_hyperparameters(hyperparameters)}
    for node in nodes:
        config, channel = node.root / "input" / "config", node.root / "input" / "data" / "training"
        for folder in (config, channel.parent, node.model_dir, node.output_dir):
            folder.mkdir(parents=True, exist_ok=True)
        if not channel.exists():
            channel.symlink_to(data_dir.resolve(), target_is_directory=True)
        (config / "resourceconfig.json").write_text(json.dumps({
            "current_host": node.host, "current_instance_type": "ml.local", "current_group_name": node.group,
            "hosts": all_hosts, "instance_groups": groups, "network_interface_name": "lo"}))
        (config / "hyperparameters.json").write_text(json.dumps({k: json.dumps(v) for k, v in hps.items()}))
        node.env = {
            "HETERO_SM_ROOT": str(node.root), "HETERO_HOST_MAP": json.dumps(host_map),
            "HETERO_JOB_SECRET": secret, "TRAINING_JOB_NAME": job_name,
            "SM_CURRENT_HOST": node.host, "SM_HOSTS": json.dumps(all_hosts),
            "SM_CURRENT_INSTANCE_GROUP": node.group, "SM_CHANNEL_TRAINING": str(channel),
            "SM_MODEL_DIR": str(node.model_dir), "SM_OUTPUT_DATA_DIR": str(node.output_dir),
            "SM_HPS": json.dumps(hps), "PYTHONPATH": python_path(), "PYTHONUNBUFFERED": "1"}
        if checkpoint_dir is not None:
            node.env["HETERO_CHECKPOINT_DIR"] = str(Path(checkpoint_dir).resolve())
        node.env.update(env or {})
    return nodes


def python_path() -> str:
    """A node's PYTHONPATH: this checkout, then the caller's (the folder ``hetero`` ran from, where
    the user's plug-ins such as ``mypkg.data:build_pipeline`` import from: hetero's cli puts it there)."""
    parts = [str(REPO_ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return os.pathsep.join(dict.fromkeys(parts))


def node_command(python: str, hyperparameters: dict[str, str]) -> list[str]:
    """``python launcher/entry.py --key value ...``, as SageMaker script mode runs it."""
    return [python, str(REPO_ROOT / "launcher" / "entry.py"), *(a for k, v in hyperparameters.items() for a in (f"--{k}", v))]


def node_environ(node: Node) -> dict[str, str]:
    """The parent's variables without SageMaker/launcher ones, plus the node's own."""
    base = {k: v for k, v in os.environ.items()
            if not (k.startswith("SM_") or k.startswith("HETERO_") or k == "TRAINING_JOB_NAME")}
    if os.environ.get("HETERO_LOG_LEVEL"):
        base["HETERO_LOG_LEVEL"] = os.environ["HETERO_LOG_LEVEL"]
    return {**base, **node.env}
