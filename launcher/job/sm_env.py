"""The one place that reads a SageMaker training container's environment.

Sources, in order of trust:

1. ``<root>/input/config/resourceconfig.json``: the job's shape (current host, hosts,
   instance groups). SageMaker always writes it; newer SDKs set no group variables, so it
   is the source of truth.
2. ``<root>/input/config/hyperparameters.json``: a flat string->string map. SDK v2
   JSON-encodes every value (a string arrives as ``"\\"abc\\""``), SDK v3 leaves strings raw;
   :func:`decode_hyperparameters` accepts both.
3. ``SM_*`` variables (set by the sagemaker-training-toolkit) only fill in what the files
   do not say: ``SM_CURRENT_HOST``, ``SM_HOSTS``, ``SM_CURRENT_INSTANCE_GROUP``,
   ``SM_INSTANCE_GROUPS_DICT``, ``SM_NUM_GPUS``, ``SM_CHANNEL_<NAME>``, ``SM_MODEL_DIR``,
   ``SM_OUTPUT_DATA_DIR``, ``SM_HPS``.

Checkpoints: SageMaker tells the container no checkpoint path (no variable is documented);
``CheckpointConfig.LocalPath`` defaults to ``/opt/ml/checkpoints``, so that is ``checkpoint_dir``
(``<root>/checkpoints``) unless ``HETERO_CHECKPOINT_DIR`` says otherwise (``hetero local``,
a job with another LocalPath; the ``checkpoint_dir`` hyperparameter overrides both).

The root and the variables are explicit arguments so tests and ``hetero local`` can point
them at an emulated tree.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from data_service.errors import ConfigError

DEFAULT_ROOT = "/opt/ml"
HOMOGENEOUS_GROUP = "homogeneousCluster"
CHECKPOINT_DIR_VAR = "HETERO_CHECKPOINT_DIR"


@dataclass(frozen=True)
class InstanceGroup:
    """One instance group: its name, instance type and hosts (in SageMaker's order)."""

    name: str
    instance_type: str
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class SageMakerEnv:
    """What this node knows about its job. Build it with :func:`load_env`."""

    root: str
    current_host: str
    current_group: str
    hosts: tuple[str, ...]
    groups: tuple[InstanceGroup, ...]
    network_interface: str
    hyperparameters: dict = field(hash=False)
    channels: dict = field(hash=False)
    model_dir: str
    output_data_dir: str
    checkpoint_dir: str
    num_gpus: int | None
    job_name: str
    sources: tuple[str, ...]

    def group(self, name: str) -> InstanceGroup:
        """The group called ``name``.

        Raises:
            ConfigError: naming the groups the job has.
        """
        for g in self.groups:
            if g.name == name:
                return g
        raise ConfigError(f"instance group {name!r} not in this job; its groups are {self.group_names()}")

    def group_names(self) -> list[str]:
        return [g.name for g in self.groups]

    @property
    def failure_file(self) -> str:
        """Where SageMaker reads a failed job's reason from."""
        return os.path.join(self.root, "output", "failure")


def decode_hyperparameters(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Decode hyperparameter values written by SDK v2 (JSON-quoted) or v3 (raw strings).

    ``'"abc"'`` -> ``"abc"``, ``'10'`` -> ``10``, ``'true'`` -> ``True``, ``'abc'`` -> ``"abc"``;
    values that are already not strings (``SM_HPS``) are kept as they are.
    """
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, str):
            with contextlib.suppress(json.JSONDecodeError):  # SDK v3: a raw string
                value = json.loads(value)
        out[str(key)] = value
    return out


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); expected SageMaker's {what}") from None


def _env_json(environ: Mapping[str, str], name: str) -> Any:
    text = environ.get(name)
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ConfigError(f"{name}={text!r} is not valid JSON; SageMaker sets it to a JSON value") from None


def _groups_from_config(config: dict, path: Path) -> list[InstanceGroup]:
    groups = []
    for item in config.get("instance_groups") or []:
        try:
            groups.append(InstanceGroup(str(item["instance_group_name"]), str(item.get("instance_type", "")),
                                        tuple(str(h) for h in item.get("hosts") or ())))
        except (KeyError, TypeError, AttributeError):
            raise ConfigError(f"{path}: instance_groups entry {item!r} lacks instance_group_name; expected "
                              "{'instance_group_name': ..., 'instance_type': ..., 'hosts': [...]}") from None
    return groups


def _groups_from_env(environ: Mapping[str, str]) -> list[InstanceGroup]:
    data = _env_json(environ, "SM_INSTANCE_GROUPS_DICT") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"SM_INSTANCE_GROUPS_DICT={data!r} must be a JSON object name -> group")
    return [InstanceGroup(str(name), str(g.get("instance_type", "")), tuple(g.get("hosts") or ()))
            for name, g in data.items()]


def _job_name(environ: Mapping[str, str], hps: Mapping[str, Any]) -> str:
    if environ.get("TRAINING_JOB_NAME"):
        return environ["TRAINING_JOB_NAME"]
    training_env = _env_json(environ, "SM_TRAINING_ENV") or {}
    if isinstance(training_env, dict) and training_env.get("job_name"):
        return str(training_env["job_name"])
    return next((str(hps[key]) for key in ("sagemaker_job_name", "job_name") if hps.get(key)), "")


def _channels(root: Path, environ: Mapping[str, str]) -> dict[str, str]:
    data_dir = root / "input" / "data"
    channels = {c.name: str(c) for c in sorted(data_dir.iterdir()) if c.is_dir()} if data_dir.is_dir() else {}
    channels.update((key[len("SM_CHANNEL_"):].lower(), value) for key, value in environ.items()
                    if key.startswith("SM_CHANNEL_") and value and key != "SM_CHANNELS")
    return channels


def _resource_config(rc_path: Path, environ: Mapping[str, str]) -> tuple[dict, str]:
    """(resourceconfig.json's content, {} without the file; where the job's shape comes from)."""
    if rc_path.is_file():
        config = _read_json(rc_path, "resourceconfig.json (current_host, hosts, instance_groups)")
        if not isinstance(config, dict):
            raise ConfigError(f"{rc_path} holds {type(config).__name__}; expected a JSON object")
        return config, str(rc_path)
    if not environ.get("SM_CURRENT_HOST"):
        raise ConfigError(f"no SageMaker job description: {rc_path} does not exist and SM_CURRENT_HOST is not set "
                          f"(found {len(list(k for k in environ if k.startswith('SM_')))} SM_* variables). Expected "
                          "a SageMaker training container; on a workstation use `hetero local`, or point "
                          "HETERO_SM_ROOT at a tree holding input/config/resourceconfig.json")
    return {}, "SM_* variables"


def _hosts(config: dict, environ: Mapping[str, str], rc_path: Path) -> tuple[str, tuple[str, ...]]:
    """(this node's host, the job's hosts), checked: the list is not empty and holds this node."""
    current_host = str(config.get("current_host") or environ.get("SM_CURRENT_HOST") or "")
    hosts = config.get("hosts") or _env_json(environ, "SM_HOSTS") or []
    if not current_host:
        raise ConfigError(f"{rc_path} has no current_host and SM_CURRENT_HOST is unset; expected e.g. 'algo-1'")
    if not isinstance(hosts, list) or not hosts:
        raise ConfigError(f"the job's host list is {hosts!r} (hosts in {rc_path} / SM_HOSTS); expected "
                          "a non-empty list such as ['algo-1', 'algo-2']")
    hosts = tuple(str(h) for h in hosts)
    if current_host not in hosts:
        raise ConfigError(f"current_host={current_host!r} is not among the job's hosts {list(hosts)}")
    return current_host, hosts


def _groups(config: dict, environ: Mapping[str, str], rc_path: Path, current_host: str,
            hosts: tuple[str, ...]) -> tuple[list[InstanceGroup], str]:
    """(the job's instance groups, the name of this node's group), checked."""
    groups = _groups_from_config(config, rc_path) or _groups_from_env(environ)
    current_group = str(config.get("current_group_name") or environ.get("SM_CURRENT_INSTANCE_GROUP") or "")
    if not groups:  # an older homogeneous job: one implicit group holding every host
        groups = [InstanceGroup(current_group or HOMOGENEOUS_GROUP,
                                str(config.get("current_instance_type", "")), hosts)]
    if not current_group:
        current_group = next((g.name for g in groups if current_host in g.hosts), "")
    _check_current_group(groups, current_group, current_host)
    return groups, current_group


def _check_current_group(groups: list[InstanceGroup], current_group: str, current_host: str) -> None:
    """Raise ConfigError unless ``current_group`` is one of ``groups`` and holds ``current_host``."""
    names = [g.name for g in groups]
    if current_group not in names:
        raise ConfigError(f"current group {current_group!r} (current_group_name / SM_CURRENT_INSTANCE_GROUP) "
                          f"is not one of the job's instance groups {names}")
    mine = next(g for g in groups if g.name == current_group)
    if not mine.hosts:
        raise ConfigError(f"instance group {current_group!r} has no hosts; expected at least one "
                          f"(this node is {current_host!r}; groups: "
                          f"{ {g.name: list(g.hosts) for g in groups} })")
    if current_host not in mine.hosts:
        raise ConfigError(f"current_host={current_host!r} is not in its group {current_group!r} "
                          f"(hosts {list(mine.hosts)})")


def _hyperparameters(hp_path: Path, environ: Mapping[str, str]) -> tuple[dict[str, Any], str | None]:
    """(the decoded hyperparameters, ``hp_path`` when they come from that file; None: from SM_HPS)."""
    if not hp_path.is_file():
        return decode_hyperparameters(_env_json(environ, "SM_HPS") or {}), None
    raw = _read_json(hp_path, "hyperparameters.json (a flat string -> string map)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{hp_path} holds {type(raw).__name__}; expected a JSON object")
    return decode_hyperparameters(raw), str(hp_path)


def _num_gpus(environ: Mapping[str, str]) -> int | None:
    """SM_NUM_GPUS as a number (None: unset)."""
    gpus = environ.get("SM_NUM_GPUS")
    try:
        return int(gpus) if gpus not in (None, "") else None
    except ValueError:
        raise ConfigError(f"SM_NUM_GPUS={gpus!r} must be an integer") from None


def load_env(root: str | os.PathLike = DEFAULT_ROOT, environ: Mapping[str, str] | None = None) -> SageMakerEnv:
    """Read this node's job description.

    Args:
        root: SageMaker's ``/opt/ml`` (or an emulated copy of it).
        environ: the variables to read (default ``os.environ``).

    Raises:
        ConfigError: no resourceconfig.json and no SM_* host variables; unknown current
            group; a current group with no hosts; malformed JSON. The message names what
            was found and what was expected.
    """
    environ = os.environ if environ is None else environ
    root = Path(root)
    config_dir = root / "input" / "config"
    rc_path = config_dir / "resourceconfig.json"
    config, shape_source = _resource_config(rc_path, environ)
    current_host, hosts = _hosts(config, environ, rc_path)
    groups, current_group = _groups(config, environ, rc_path, current_host, hosts)
    hps, hp_source = _hyperparameters(config_dir / "hyperparameters.json", environ)
    return SageMakerEnv(
        root=str(root), current_host=current_host, current_group=current_group, hosts=hosts,
        groups=tuple(groups),
        network_interface=str(config.get("network_interface_name")
                              or environ.get("SM_NETWORK_INTERFACE_NAME") or ""),
        hyperparameters=hps, channels=_channels(root, environ),
        model_dir=environ.get("SM_MODEL_DIR") or str(root / "model"),
        output_data_dir=environ.get("SM_OUTPUT_DATA_DIR") or str(root / "output" / "data"),
        checkpoint_dir=environ.get(CHECKPOINT_DIR_VAR) or str(root / "checkpoints"),
        num_gpus=_num_gpus(environ), job_name=_job_name(environ, hps),
        sources=(shape_source, hp_source) if hp_source else (shape_source,))
