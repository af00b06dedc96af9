"""Which role this node plays, and where every other node is.

A node's role follows from its instance group's name: groups named by ``data_group`` serve
batches, groups named by ``dnn_group`` train. A job with one group (SageMaker names it
``homogeneousCluster``), or the ``homogeneous`` option, trains with the pipeline in-process.
Two kinds of job share a data group that is not their own (a sweep, docs/sweep.md): a data-only
job (``join``), whose nodes serve that registry, and a DNN-only job, whose one group is its
``dnn_group`` and whose data servers are those its ``registry`` lists.
The order of hosts inside SageMaker's lists is not documented, so nothing here assumes which
``algo-N`` lands in which group.

Host names resolve through DNS on SageMaker. ``hetero local`` runs every node on one machine
and passes ``HETERO_HOST_MAP`` (JSON ``{"algo-1": "127.0.0.1:41234", ...}``): the address to
reach each host at and, when given, the port its data server listens on.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping

from data_service.errors import ConfigError

from ..config import LaunchConfig
from .sm_env import SageMakerEnv

DATA, DNN, HOMOGENEOUS, IDLE = "data", "dnn", "homogeneous", "idle"
HOST_MAP_VAR = "HETERO_HOST_MAP"


@dataclass(frozen=True)
class NodeAssignment:
    """This node's part in the job.

    Attributes:
        role: ``data``, ``dnn``, ``homogeneous`` (trains with an in-process pipeline) or
            ``idle`` (a data host of a job forced homogeneous: nothing to do).
        host: this node's host name.
        data_hosts: hosts running data servers (empty in homogeneous mode).
        dnn_hosts: hosts running trainers, in natural order (``host_key``); the first is MASTER_ADDR.
        node_rank: position of this host in ``dnn_hosts`` (-1 elsewhere).
        shared_group: a DNN-only job reading a data group it does not own (a sweep's): its data
            servers are its registry's alone, and it never shuts them down (the group ends on
            its idle timeout, once the last job is gone).
    """

    role: str
    host: str
    data_hosts: tuple[str, ...]
    dnn_hosts: tuple[str, ...]
    node_rank: int
    shared_group: bool = False

    @property
    def mode(self) -> str:
        return "homogeneous" if self.role in (HOMOGENEOUS, IDLE) else "heterogeneous"


def host_key(host: str) -> tuple:
    """Natural order (algo-2 before algo-10): every node sorts the same way whatever order its
    resourceconfig.json lists hosts in, so node ranks and MASTER_ADDR agree across nodes."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", host))


def _hosts_of(env: SageMakerEnv, names: list[str], option: str) -> tuple[str, ...]:
    hosts: list[str] = []
    for name in names:
        if name not in env.group_names():
            raise ConfigError(f"{option}={name!r} names no instance group of this job; its groups are "
                              f"{env.group_names()} (set the hyperparameter {option} to one of them)")
        group = env.group(name)
        if not group.hosts:
            raise ConfigError(f"instance group {name!r} ({option}) has no hosts; give it InstanceCount >= 1")
        hosts.extend(group.hosts)
    return tuple(sorted(hosts, key=host_key))


def plan_roles(env: SageMakerEnv, cfg: LaunchConfig) -> NodeAssignment:
    """Decide this node's role.

    Raises:
        ConfigError: the current group is neither a data nor a dnn group; a named group is
            missing or empty; a job whose only group is a data group.
    """
    data_names, dnn_names = cfg.roles.group_list("data_group"), cfg.roles.group_list("dnn_group")
    overlap = set(data_names) & set(dnn_names)
    if overlap:
        raise ConfigError(f"group(s) {sorted(overlap)} named both data_group and dnn_group; name each once")
    if cfg.elastic.join:  # a data-only job: every node serves another job's registry
        hosts = tuple(sorted(env.hosts, key=host_key))
        return NodeAssignment(DATA, env.current_host, hosts, (), -1)
    if len(env.groups) == 1:
        only = env.groups[0]
        if only.name in data_names:
            raise ConfigError(f"the job's only instance group {only.name!r} is a data group (data_group="
                              f"{cfg.roles.data_group!r}); add a dnn group {cfg.roles.dnn_group!r}, rename the group, or set join= to "
                              "serve another job's registry")
        hosts = tuple(sorted(only.hosts, key=host_key))
        if cfg.elastic.registry and only.name in dnn_names and not cfg.roles.homogeneous:
            return NodeAssignment(DNN, env.current_host, (), hosts, hosts.index(env.current_host), shared_group=True)
        return NodeAssignment(HOMOGENEOUS, env.current_host, (), hosts, hosts.index(env.current_host))
    if env.current_group not in data_names + dnn_names:
        raise ConfigError(f"this node's group {env.current_group!r} is neither a data group "
                          f"(data_group={cfg.roles.data_group!r}) nor a dnn group (dnn_group={cfg.roles.dnn_group!r}); "
                          f"the job's groups are {env.group_names()}: set data_group / dnn_group to match")
    dnn_hosts = _hosts_of(env, dnn_names, "dnn_group")
    if cfg.roles.homogeneous:
        if env.current_group in data_names:
            return NodeAssignment(IDLE, env.current_host, (), dnn_hosts, -1)
        return NodeAssignment(HOMOGENEOUS, env.current_host, (), dnn_hosts, dnn_hosts.index(env.current_host))
    data_hosts = _hosts_of(env, data_names, "data_group")
    if env.current_group in data_names:
        return NodeAssignment(DATA, env.current_host, data_hosts, dnn_hosts, -1)
    return NodeAssignment(DNN, env.current_host, data_hosts, dnn_hosts, dnn_hosts.index(env.current_host))


def host_map(environ: Mapping[str, str]) -> dict[str, str]:
    """``HETERO_HOST_MAP`` decoded (empty when unset)."""
    text = environ.get(HOST_MAP_VAR, "")
    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise ConfigError(f"{HOST_MAP_VAR}={text!r} must be a JSON object such as "
                          '{"algo-1": "127.0.0.1:41234"}')
    return {str(k): str(v) for k, v in data.items()}


def resolve(host: str, default_port: int, mapping: Mapping[str, str]) -> tuple[str, int]:
    """(address, data-server port) of ``host``: the host map's entry, else (host, default_port)."""
    entry = mapping.get(host)
    if entry is None:
        return host, default_port
    addr, sep, port = entry.rpartition(":")
    if sep and port.isdigit() and addr:
        return addr, int(port)
    return entry, default_port


def data_addresses(plan: NodeAssignment, cfg: LaunchConfig, mapping: Mapping[str, str]) -> list[str]:
    """gRPC ``address:port`` of every data server the trainers read from."""
    hosts = list(plan.data_hosts)
    if cfg.serve.dnn_local_server and plan.role == DNN:
        hosts.append(plan.host)
    return ["%s:%d" % resolve(h, cfg.serve.data_port, mapping) for h in hosts]
