#!/usr/bin/env python3
"""Write what SageMaker would give each node of a heterogeneous job, and a compose file to run it.

For every host ``algo-N`` it writes ``<config-dir>/algo-N/config/resourceconfig.json`` and
``hyperparameters.json`` (the files SageMaker puts in /opt/ml/input/config; hyperparameters
JSON-encoded the way SDK v2 sends them), and it writes a compose file with one service per host
on one network, so the host names resolve. Each service gets its config folder at
/opt/ml/input/config and the variables the SageMaker training toolkit would set (``SM_*``),
plus ``TRAINING_JOB_NAME`` and ``HETERO_JOB_SECRET`` (the job token's inputs).

Data and DNN hosts are interleaved (``algo-1`` data, ``algo-2`` dnn, ``algo-3`` data, ...):
SageMaker does not document which algo-N lands in which group, so the launcher must not care.

The repository's ``docker-compose.yml`` and ``docker/job/`` are this script's output for the
defaults (two data nodes, one DNN node); ``tests/test_containers.py`` checks they are current.

Usage (stdlib only; run from anywhere):
    python docker/make-config.py                         # rewrite docker/job/ and docker-compose.yml
    python docker/make-config.py --data-nodes 3 --dnn-nodes 2 --hp max_steps=500 \\
        --config-dir out/job3 --compose out/job3/compose.yml
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA_GROUP, DNN_GROUP = "data_group", "dnn_group"
DATA_TYPE, DNN_TYPE = "ml.c5.xlarge", "ml.g5.xlarge"   # labels only: nothing reads them
# A short real training run: real MNIST steps on CPU (or GPU), bounded so `compose up` ends soon.
DEFAULT_HPS = {"epochs": 1, "max_steps": 120, "log_every": 20, "data_wait_s": 300,
               "watchdog_connect_s": 600, "watchdog_idle_s": 120}


def layout(data_nodes: int, dnn_nodes: int) -> list[tuple[str, str]]:
    """[(host, group)], data and dnn hosts interleaved, data first."""
    if data_nodes < 1 or dnn_nodes < 1:
        sys.exit("make-config: a heterogeneous job needs --data-nodes >= 1 and --dnn-nodes >= 1")
    groups: list[str] = []
    d, n = data_nodes, dnn_nodes
    while d or n:
        if d:
            groups.append(DATA_GROUP)
            d -= 1
        if n:
            groups.append(DNN_GROUP)
            n -= 1
    return [(f"algo-{i + 1}", g) for i, g in enumerate(groups)]


def parse_hp(items: list[str]) -> dict:
    out = dict(DEFAULT_HPS)
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            sys.exit(f"make-config: --hp {item!r}: expected key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def resource_config(host: str, nodes: list[tuple[str, str]]) -> dict:
    """resourceconfig.json for ``host``, keys in the order a real heterogeneous job writes them."""
    group = dict(nodes)[host]
    groups = []
    for name, itype in ((DATA_GROUP, DATA_TYPE), (DNN_GROUP, DNN_TYPE)):
        groups.append({"instance_group_name": name, "instance_type": itype,
                       "hosts": [h for h, g in nodes if g == name]})
    return {"current_host": host, "current_instance_type": DATA_TYPE if group == DATA_GROUP else DNN_TYPE,
            "current_group_name": group, "hosts": [h for h, _ in nodes], "instance_groups": groups,
            "network_interface_name": "eth0"}


def toolkit_env(host: str, rc: dict, hps: dict) -> dict[str, str]:
    """The SM_* variables the sagemaker-training-toolkit derives from the files."""
    groups = {g["instance_group_name"]: {"hosts": g["hosts"], "instance_group_name": g["instance_group_name"],
                                        "instance_type": g["instance_type"]} for g in rc["instance_groups"]}
    mine = groups[rc["current_group_name"]]
    return {
        "SM_CURRENT_HOST": host,
        "SM_CURRENT_INSTANCE_TYPE": rc["current_instance_type"],
        "SM_CURRENT_INSTANCE_GROUP": rc["current_group_name"],
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": json.dumps(mine["hosts"]),
        "SM_INSTANCE_GROUPS": json.dumps(list(groups)),
        "SM_INSTANCE_GROUPS_DICT": json.dumps(groups),
        "SM_IS_HETERO": "true",
        "SM_HOSTS": json.dumps(rc["hosts"]),
        "SM_NETWORK_INTERFACE_NAME": rc["network_interface_name"],
        "SM_CHANNEL_TRAINING": "/opt/ml/input/data/training",
        "SM_MODEL_DIR": "/opt/ml/model",
        "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data",
        "SM_HPS": json.dumps(hps),
    }


def _q(value: str) -> str:
    """A YAML scalar: single-quoted (JSON inside stays as is)."""
    return "'" + value.replace("'", "''") + "'"


def compose_text(nodes: list[tuple[str, str]], config_rel: str, envs: dict[str, dict]) -> str:
    lines = [
        "# A local heterogeneous SageMaker-like job: data-node and DNN-node containers on one network,",
        "# where the host names algo-1..n resolve. Generated by docker/make-config.py (edit that, not this).",
        "# Build the images first: bash scripts/build-images.sh. Then, from the repository root:",
        "#   docker compose up            (or: podman-compose up)",
        "# The DNN node trains, writes out/compose/<host>/{model,output}, and shuts the data nodes down;",
        "# every container then exits 0. GPU: add -f docker/compose.gpu.yml. See docs/containers.md.",
        "services:",
    ]
    for host, group in nodes:
        kind = "data" if group == DATA_GROUP else "dnn"
        image = "${HETERO_DATA_IMAGE:-localhost/hetero-data:latest}" if kind == "data" \
            else "${HETERO_DNN_IMAGE:-localhost/hetero-dnn:latest}"
        out = "${HETERO_COMPOSE_OUT:-./out/compose}/" + host
        lines += [
            f"  {host}:",
            f"    image: {image}",
            f"    hostname: {host}",
            "    command: [\"train\"]",
            "    environment:",
            "      TRAINING_JOB_NAME: ${TRAINING_JOB_NAME:-hetero-compose-job}",
            "      HETERO_JOB_SECRET: ${HETERO_JOB_SECRET:-local-compose-secret-change-me}",
            "      HETERO_SYNTH_TRAIN: ${HETERO_SYNTH_TRAIN:-8192}",
            "      HETERO_SYNTH_TEST: ${HETERO_SYNTH_TEST:-1000}",
        ]
        lines += [f"      {k}: {_q(v)}" for k, v in envs[host].items()]
        lines += [
            "    volumes:",
            f"      - {config_rel}/{host}/config:/opt/ml/input/config:ro",
            f"      - {out}/model:/opt/ml/model",
            f"      - {out}/output:/opt/ml/output",
        ]
    return "\n".join(lines) + "\n"


def gpu_override_text(nodes: list[tuple[str, str]]) -> str:
    lines = ["# Give the DNN node(s) every GPU (Docker with the NVIDIA container toolkit):",
             "#   docker compose -f docker-compose.yml -f docker/compose.gpu.yml up",
             "# Generated by docker/make-config.py.", "services:"]
    for host, group in nodes:
        if group == DNN_GROUP:
            lines += [f"  {host}:", "    deploy:", "      resources:", "        reservations:", "          devices:",
                      "            - driver: nvidia", "              count: all", "              capabilities: [gpu]"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-nodes", type=int, default=2)
    p.add_argument("--dnn-nodes", type=int, default=1)
    p.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE",
                   help=f"hyperparameter (repeatable); defaults {DEFAULT_HPS}")
    p.add_argument("--config-dir", type=Path, default=REPO / "docker" / "job")
    p.add_argument("--compose", type=Path, default=REPO / "docker-compose.yml")
    p.add_argument("--gpu-override", type=Path, default=None,
                   help="also write a GPU override file (default: docker/compose.gpu.yml beside the default "
                        "compose file, none otherwise)")
    args = p.parse_args(argv)
    nodes = layout(args.data_nodes, args.dnn_nodes)
    hps = parse_hp(args.hp)
    envs = {}
    for host, _ in nodes:
        rc = resource_config(host, nodes)
        folder = args.config_dir / host / "config"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "resourceconfig.json").write_text(json.dumps(rc, indent=1) + "\n")
        (folder / "hyperparameters.json").write_text(
            json.dumps({k: json.dumps(v) for k, v in hps.items()}, indent=1) + "\n")
        envs[host] = toolkit_env(host, rc, hps)
    compose = args.compose.resolve()
    config_rel = os.path.relpath(args.config_dir.resolve(), compose.parent)
    config_rel = config_rel if config_rel.startswith(("/", ".")) else "./" + config_rel
    compose.parent.mkdir(parents=True, exist_ok=True)
    compose.write_text(compose_text(nodes, config_rel, envs))
    gpu = args.gpu_override
    if gpu is None and compose == (REPO / "docker-compose.yml").resolve():
        gpu = REPO / "docker" / "compose.gpu.yml"
    if gpu is not None:
        gpu.write_text(gpu_override_text(nodes))
    print(f"make-config: {', '.join(f'{h} {g}' for h, g in nodes)}; configs in {args.config_dir}; compose file "
          f"{compose}" + (f"; GPU override {gpu}" if gpu else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
