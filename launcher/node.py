"""The launcher: read the job, pick this node's role, run it.

Runs the same on every node of a job (``python launcher/entry.py`` on SageMaker,
``hetero launch`` elsewhere). ``HETERO_SM_ROOT`` points it at an emulated ``/opt/ml``.
Command-line ``--key value`` pairs (how SageMaker passes hyperparameters to a script) override
``hyperparameters.json``.
"""
from __future__ import annotations

import logging
import os
import traceback
from typing import Mapping, Sequence

from data_service.errors import ConfigError, DataServiceError

from . import log_setup as logs
from .config import LaunchConfig
from .job.jobsecret import with_job_secret
from .job.jobtoken import job_token
from .job.output_files import write_failure
from .job.preflight import preflight
from .job.roles import DATA, DNN, HOMOGENEOUS, IDLE, data_addresses, host_map, plan_roles, resolve
from .job.sm_env import DEFAULT_ROOT, SageMakerEnv, decode_hyperparameters, load_env

log = logging.getLogger(__name__)

EXIT_CONFIG = 2


def parse_cli(argv: Sequence[str]) -> dict[str, str]:
    """``["--epochs", "3", "--homogeneous=true"]`` -> ``{"epochs": "3", "homogeneous": "true"}``."""
    out: dict[str, str] = {}
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if not item.startswith("--") or len(item) < 3:
            raise ConfigError(f"argument {item!r}: expected --key value pairs (SageMaker hyperparameters)")
        key, eq, value = item[2:].partition("=")
        if not eq:
            if i + 1 >= len(items) or items[i + 1].startswith("--"):
                raise ConfigError(f"argument {item!r} has no value; pass --{key} VALUE")
            value = items[i + 1]
            i += 1
        out[key.replace("-", "_") if "." not in key else key] = value
        i += 1
    return out


def _fail(env: SageMakerEnv | None, message: str, code: int) -> int:
    log.error("%s", message)
    if env is not None:
        write_failure(env.failure_file, message)
    return code


def main(argv: Sequence[str] = (), environ: Mapping[str, str] | None = None, root: str | None = None) -> int:
    """Run this node's part of the job; returns the process exit code."""
    environ = os.environ if environ is None else environ
    root = root or environ.get("HETERO_SM_ROOT", DEFAULT_ROOT)
    env = None
    try:
        env = load_env(root, environ)
        hps = {**env.hyperparameters, **decode_hyperparameters(parse_cli(argv))}
        cfg = LaunchConfig.from_hyperparameters(hps)
        plan = plan_roles(env, cfg)
        logs.setup(plan.role, env.current_host, level=cfg.job.log_level)
        log.info("job %r: group %r -> role %s (data hosts %s, dnn hosts %s%s); read %s", env.job_name,
                 env.current_group, plan.role, list(plan.data_hosts), list(plan.dnn_hosts),
                 f"; data servers of registry {cfg.elastic.registry}, another job's" if plan.shared_group else "",
                 ", ".join(env.sources))
        if plan.role == IDLE:
            log.info("homogeneous=true: data hosts have nothing to do; exiting")
            return 0
        for name, path in env.channels.items():  # a bare container has the folders but no variables
            os.environ.setdefault(f"SM_CHANNEL_{name.upper()}", path)
        # a data-only job that joins another job proves that job's token, and a DNN-only job reading
        # another job's data group proves the same: job_name names that job (a sweep's name)
        shares = bool(cfg.elastic.join) or plan.shared_group
        name = cfg.job.job_name if shares and cfg.job.job_name else env.job_name or cfg.job.job_name
        token = job_token(with_job_secret(environ), name, cfg.job.job_secret)
        preflight(cfg, plan.role)  # every plug-in and its options, before waiting or training
        mapping = host_map(environ)
        if plan.role == DATA:
            from .serve.data_node import run_data_node
            _, port = resolve(env.current_host, cfg.serve.data_port, mapping)
            return run_data_node(cfg, token, port, env.output_data_dir, env.current_host)
        return _run_trainer_node(env, cfg, plan, token, mapping)
    except (ConfigError, DataServiceError) as exc:
        if env is None:
            logging.basicConfig(level=logging.INFO)
        return _fail(env, f"launcher: {exc}", EXIT_CONFIG)
    except Exception as exc:
        logging.getLogger(__name__).error("%s", traceback.format_exc())
        return _fail(env, f"launcher: unexpected {type(exc).__name__}: {exc}", 1)


def instance_types(env: SageMakerEnv, plan) -> dict[str, str]:
    """The data hosts' and this DNN host's instance types (for the live advice's costs)."""
    types = {h: g.instance_type for g in env.groups for h in g.hosts}
    data = [types[h] for h in plan.data_hosts if types.get(h)]
    return {"data_instance_type": data[0] if data else "", "dnn_instance_type": types.get(plan.host, "")}


def _run_trainer_node(env: SageMakerEnv, cfg: LaunchConfig, plan, token: str, mapping) -> int:
    from .train.dnn_node import local_procs, run_dnn_node
    from .train.trainer import TrainJob

    servers: tuple[str, ...] = ()
    server_hosts: tuple[str, ...] = ()
    local_server = None
    nprocs = local_procs(cfg.dnn.procs_per_node, env.num_gpus)
    if plan.role == HOMOGENEOUS and cfg.data.homogeneous_server_workers(nprocs):
        # the node's own data server builds the batches (docs/launcher.md, "Homogeneous mode")
        from .serve.server import start_server
        port = resolve(plan.host, cfg.serve.data_port, mapping)[1]
        local_server = start_server(cfg, token, port, host="127.0.0.1", workers=cfg.data.homogeneous_server_workers(nprocs),
                                    beside_trainer=True)
        servers, server_hosts = (f"127.0.0.1:{local_server.port}",), (plan.host,)
    if plan.role == DNN:
        servers = tuple(data_addresses(plan, cfg, mapping))
        server_hosts = tuple(plan.data_hosts) + ((plan.host,) if cfg.serve.dnn_local_server else ())
        if cfg.serve.dnn_local_server:
            from .serve.server import start_server
            local_server = start_server(cfg, token, resolve(plan.host, cfg.serve.data_port, mapping)[1], beside_trainer=True)
    master_addr, _ = resolve(plan.dnn_hosts[0], cfg.serve.data_port, mapping)
    job = TrainJob(cfg=cfg, mode=plan.mode, host=plan.host, dnn_hosts=plan.dnn_hosts, node_rank=plan.node_rank,
                   nprocs=nprocs, master_addr=master_addr,
                   model_dir=env.model_dir, output_dir=env.output_data_dir, token=token, servers=servers,
                   server_hosts=server_hosts, checkpoint_dir=cfg.checkpoints.checkpoint_dir or env.checkpoint_dir,
                   shared_group=plan.shared_group,
                   extra={"data_hosts": list(plan.data_hosts), "job_name": env.job_name,
                          **instance_types(env, plan)})
    return run_dnn_node(job, cfg.dnn.data_wait_s, local_server)
