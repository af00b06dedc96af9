"""launcher.job.sm_env: real resourceconfig.json samples, hyperparameter quoting, errors."""
import json

import pytest

from data_service.errors import ConfigError
from launcher.job.sm_env import decode_hyperparameters, load_env

# As seen in a real heterogeneous job's log (2022), key order kept.
HETERO = {"current_host": "algo-1", "current_instance_type": "ml.c5.9xlarge", "current_group_name": "data_group",
          "hosts": ["algo-1", "algo-2"],
          "instance_groups": [
              {"instance_group_name": "data_group", "instance_type": "ml.c5.9xlarge", "hosts": ["algo-1"]},
              {"instance_group_name": "dnn_group", "instance_type": "ml.p3.2xlarge", "hosts": ["algo-2"]}],
          "network_interface_name": "eth0"}
# A homogeneous two-node job: one group, named homogeneousCluster; its host list in another order.
HOMO = {"current_host": "algo-2", "current_instance_type": "ml.p3.2xlarge", "current_group_name": "homogeneousCluster",
        "hosts": ["algo-1", "algo-2"],
        "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": "ml.p3.2xlarge",
                             "hosts": ["algo-2", "algo-1"]}],
        "network_interface_name": "eth0"}


def make_root(tmp_path, resourceconfig=None, hyperparameters=None):
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    if resourceconfig is not None:
        (config / "resourceconfig.json").write_text(json.dumps(resourceconfig))
    if hyperparameters is not None:
        (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    return tmp_path


def test_heterogeneous_sample(tmp_path):
    env = load_env(make_root(tmp_path, HETERO, {"epochs": "3"}), {"TRAINING_JOB_NAME": "job-1"})
    assert env.current_host == "algo-1" and env.current_group == "data_group"
    assert env.hosts == ("algo-1", "algo-2")
    assert env.group("dnn_group").hosts == ("algo-2",) and env.group("dnn_group").instance_type == "ml.p3.2xlarge"
    assert env.network_interface == "eth0" and env.job_name == "job-1"
    assert env.model_dir == str(tmp_path / "model") and env.output_data_dir == str(tmp_path / "output" / "data")
    assert env.hyperparameters == {"epochs": 3} and env.num_gpus is None
    with pytest.raises(Exception):
        env.current_host = "x"  # frozen


def test_homogeneous_sample(tmp_path):
    env = load_env(make_root(tmp_path, HOMO), {"SM_NUM_GPUS": "1", "SM_CHANNEL_TRAINING": "/data/train"})
    assert env.current_group == "homogeneousCluster" and env.group_names() == ["homogeneousCluster"]
    assert env.num_gpus == 1 and env.channels["training"] == "/data/train"


def test_file_is_the_truth_variables_only_fill_in(tmp_path):
    rc = dict(HETERO)
    del rc["current_group_name"]  # an SDK that leaves it out: found from the groups
    env = load_env(make_root(tmp_path, rc), {"SM_CURRENT_HOST": "algo-2", "SM_MODEL_DIR": "/m"})
    assert env.current_host == "algo-1" and env.current_group == "data_group" and env.model_dir == "/m"


def test_variables_alone_when_there_is_no_file(tmp_path):
    groups = {"data_group": {"hosts": ["algo-2"], "instance_group_name": "data_group", "instance_type": "ml.c5.xlarge"},
              "dnn_group": {"hosts": ["algo-1"], "instance_group_name": "dnn_group", "instance_type": "ml.g5.xlarge"}}
    environ = {"SM_CURRENT_HOST": "algo-1", "SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_INSTANCE_GROUP": "dnn_group",
               "SM_INSTANCE_GROUPS_DICT": json.dumps(groups), "SM_HPS": '{"epochs": 2, "pipeline": "a.b:c"}',
               "SM_TRAINING_ENV": '{"job_name": "from-training-env"}'}
    env = load_env(tmp_path, environ)
    assert env.current_group == "dnn_group" and env.group("data_group").hosts == ("algo-2",)
    assert env.hyperparameters == {"epochs": 2, "pipeline": "a.b:c"} and env.job_name == "from-training-env"
    assert env.sources == ("SM_* variables",)


def test_sdk_v2_and_v3_hyperparameters_decode_alike():
    v2 = {"pipeline": '"examples.mnist:build_pipeline"', "epochs": "3", "homogeneous": "true", "lr": "0.5",
          "pipeline_options": '{"batch_size": 64}'}
    v3 = {"pipeline": "examples.mnist:build_pipeline", "epochs": "3", "homogeneous": "true", "lr": "0.5",
          "pipeline_options": '{"batch_size": 64}'}
    assert decode_hyperparameters(v2) == decode_hyperparameters(v3) == {
        "pipeline": "examples.mnist:build_pipeline", "epochs": 3, "homogeneous": True, "lr": 0.5,
        "pipeline_options": {"batch_size": 64}}


def test_missing_file_and_variables_says_what_was_expected(tmp_path):
    with pytest.raises(ConfigError, match="resourceconfig.json does not exist and SM_CURRENT_HOST is not set"):
        load_env(tmp_path, {})


def test_unknown_current_group(tmp_path):
    rc = dict(HETERO, current_group_name="gpu_group")
    with pytest.raises(ConfigError, match=r"'gpu_group'.*\['data_group', 'dnn_group'\]"):
        load_env(make_root(tmp_path, rc), {})


def test_current_group_with_no_hosts(tmp_path):
    rc = json.loads(json.dumps(HETERO))
    rc["instance_groups"][0]["hosts"] = []
    with pytest.raises(ConfigError, match="'data_group' has no hosts"):
        load_env(make_root(tmp_path, rc), {})


def test_current_host_outside_its_own_group(tmp_path):
    rc = dict(HETERO, current_host="algo-2")  # algo-2 is in dnn_group, the file says data_group
    with pytest.raises(ConfigError, match=r"current_host='algo-2' is not in its group 'data_group' \(hosts \['algo-1'\]\)"):
        load_env(make_root(tmp_path, rc), {})


@pytest.mark.parametrize("broken, message", [
    ({"hosts": ["algo-1"]}, "no current_host"),
    ({"current_host": "algo-9", "hosts": ["algo-1"]}, "not among the job's hosts"),
    ({"current_host": "algo-1", "hosts": []}, "non-empty list"),
])
def test_malformed_resourceconfig(tmp_path, broken, message):
    with pytest.raises(ConfigError, match=message):
        load_env(make_root(tmp_path, broken), {})


def test_invalid_json_names_the_file(tmp_path):
    root = make_root(tmp_path)
    (root / "input" / "config" / "resourceconfig.json").write_text("{not json")
    with pytest.raises(ConfigError, match="resourceconfig.json is not valid JSON"):
        load_env(root, {})


def test_checkpoint_dir_defaults_to_sagemakers_local_path_under_the_root(tmp_path):
    root = make_root(tmp_path, HETERO)
    assert load_env(root, {}).checkpoint_dir == str(tmp_path / "checkpoints")  # /opt/ml/checkpoints on SageMaker
    assert load_env(root, {"HETERO_CHECKPOINT_DIR": "/keep/ckpt"}).checkpoint_dir == "/keep/ckpt"
