"""The launcher run by the SageMaker SDK v3's own in-container driver, as ModelTrainer jobs run it.

Each emulated node runs ``basic_script_driver.py`` from the installed SDK package, in the code
folder ModelTrainer would upload (``stage_source``), with the variables the SDK's
``environment.py`` sets: ``SM_HPS`` and ``SM_ENTRY_SCRIPT``, no ``SM_CURRENT_INSTANCE_GROUP`` /
``SM_INSTANCE_GROUPS*``, and SDK-v3 ``hyperparameters.json`` (strings unquoted). The driver
passes the hyperparameters as ``--key value`` arguments; the launcher must find its role in
``resourceconfig.json`` and train across a data node and a DNN node.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hetero.sagemaker import sdk_version
from launcher.metric_lines import METRIC_DEFINITIONS

if sdk_version.sdk_problem() is not None:
    pytest.skip(f"SageMaker SDK driver test: {sdk_version.sdk_problem()}", allow_module_level=True)

from _launcher_helpers import SYNTHETIC_HPS, synth_data, wait_for_nodes  # noqa: E402


def _driver() -> Path:
    import sagemaker.train

    path = Path(sagemaker.train.__file__).parent / "container_drivers" / "distributed_drivers" / "basic_script_driver.py"
    assert path.is_file(), path
    return path


def _sdk_environ(node, hps: dict, source: Path) -> dict[str, str]:
    from hetero.local.tree import node_environ

    env = {k: v for k, v in node_environ(node).items()
           if not k.startswith(("SM_CURRENT_INSTANCE_GROUP", "SM_INSTANCE_GROUPS", "SM_IS_HETERO")) and k != "PYTHONPATH"}
    resource = json.loads((node.root / "input" / "config" / "resourceconfig.json").read_text())
    hosts = sorted(resource["hosts"])
    env.update({"SM_ENTRY_SCRIPT": "launcher/entry.py", "SM_SOURCE_DIR": str(source), "SM_HPS": json.dumps(hps),
                "SM_MASTER_ADDR": "algo-1", "SM_MASTER_PORT": "7777", "SM_HOST_COUNT": str(len(hosts)),
                "SM_CURRENT_HOST_RANK": str(hosts.index(node.host)), "SM_RESOURCE_CONFIG": json.dumps(resource)})
    return env


@pytest.mark.slow
def test_launcher_trains_under_the_sdk_driver(tmp_path):
    from hetero.local.tree import build_nodes
    from hetero.sagemaker.sdk import stage_source

    source = stage_source()
    data = synth_data(tmp_path / "data", 64, 0)
    hps = {"data_group": "data_group", "dnn_group": "dnn_group",  # as model_trainer sends them
           **SYNTHETIC_HPS, "loader_workers": 0, "emulate_step_s": 0.01, "evaluate": "", "log_every": 4}
    nodes = build_nodes(tmp_path / "nodes", 1, 1, False, data, hps, "sdk-job")
    procs = {}
    for node in nodes:
        # what ModelTrainer writes: every value a string, strings unquoted (SDK v3)
        config_hps = {k: v if isinstance(v, str) else json.dumps(v) for k, v in {**hps, "bind_host": "127.0.0.1",
                      "master_port": json.loads((node.root / "input/config/hyperparameters.json").read_text())
                      ["master_port"]}.items()}
        (node.root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(config_hps))
        log = open(tmp_path / f"{node.host}.log", "w")
        procs[node.host] = (subprocess.Popen([sys.executable, str(_driver())], cwd=source, stdout=log,
                                             stderr=subprocess.STDOUT, env=_sdk_environ(node, config_hps, source),
                                             start_new_session=True), log)
    logs = wait_for_nodes(procs, tmp_path, 150)
    assert {h: p.returncode for h, (p, _) in procs.items()} == {n.host: 0 for n in nodes}, logs
    dnn = next(n for n in nodes if n.role == "dnn")
    data_node = next(n for n in nodes if n.role == "data")
    for host, text in logs.items():
        assert "Executing command:" in text and "--data_group data_group" in text  # hyperparameters as CLI args
        assert f"{sys.executable} launcher/entry.py" in text  # the staged code, not this checkout
    assert "role dnn" in logs[dnn.host] and "role data" in logs[data_node.host]
    metrics = json.loads((dnn.output_dir / "metrics.json").read_text())
    assert metrics["steps"] == 50 and metrics["mode"] == "heterogeneous"
    # the driver re-logs each line: SageMaker's metric regexes still read them
    step = next(d["Regex"] for d in METRIC_DEFINITIONS if d["Name"] == "train:step_time_s")
    found = [float(m.group(1)) for line in logs[dnn.host].splitlines() if (m := re.search(step, line))]
    assert found and found[-1] == pytest.approx(metrics["avg_step_time_s"], abs=1e-4)
