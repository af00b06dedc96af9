"""A data server of the job's pipeline, started with the launcher's options: a data node's, or the
one a DNN host runs beside its trainers (homogeneous mode, ``dnn_local_server``); and the address
its registry entry gives.
"""
from __future__ import annotations

import os

from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions

from ..config import LaunchConfig


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def start_server(cfg: LaunchConfig, token: str, port: int, host: str | None = None, workers: int = 0,
                 beside_trainer: bool = False) -> DataServer:
    """Start a data server for the job's pipeline on ``port`` with ``workers`` worker processes
    (0: ``data_workers``, else one per usable CPU). ``beside_trainer``: the server shares the
    node's cores with its trainers (homogeneous mode, ``dnn_local_server``): its workers run at
    ``local_server_nice``, so they build in the cycles the trainers leave. Raises ConfigError."""
    options = ServerOptions(host=host or cfg.serve.bind_host, port=port, bulk_port=cfg.serve.bulk_port,
                            num_workers=workers or cfg.serve.data_workers or usable_cpus(),
                            worker_nice=cfg.serve.local_server_nice if beside_trainer else 0,
                            # a window serves several jobs; the server beside one job's trainers has one
                            batch_window_bytes=0 if beside_trainer else cfg.serve.batch_window)
    return DataServer(PipelineSpec(cfg.data.pipeline, cfg.data.pipeline_options), token, options).start()


def advertised_address(cfg: LaunchConfig, host: str, port: int) -> str:
    """The address this node's registry entry gives: ``advertise_host`` if set; for a node of the
    job itself, the address its own trainers dial (so both name one server); for a node joining
    another job, this machine's IP (the other job cannot resolve this job's host names)."""
    from data_service.membership.joining import default_advertise_host

    from ..job.roles import host_map, resolve

    if cfg.elastic.advertise_host:
        return f"{cfg.elastic.advertise_host}:{port}"
    if cfg.elastic.join:
        return f"{default_advertise_host(cfg.serve.bind_host)}:{port}"
    return f"{resolve(host, cfg.serve.data_port, host_map(os.environ))[0]}:{port}"
