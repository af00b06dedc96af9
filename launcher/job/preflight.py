"""Start-up checks of the job's plug-ins, on every node, before anything waits or trains.

A typo in an option must fail in seconds on the node that reads it, not after the DNN node
waited ``data_wait_s`` for data servers, nor after a whole training run (``evaluate`` is
first used at the end). Every import-path option (``pipeline``, ``model``, ``step``,
``evaluate``, ``optimizer``) is imported and checked callable, and the options given to the
pipeline builder and to the model are checked against their signatures. None of this needs
the training data, which a node outside the data group may not have; the pipeline itself
(values, data, its ``finish`` stage) is built by the data servers at their start and, in
homogeneous mode, here.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec

from ..config import LaunchConfig, load_object

log = logging.getLogger(__name__)


def check_call(func: Callable[..., Any], options: dict, what: str, target: str) -> None:
    """Raise ConfigError when ``func(**options)`` would fail on the option names alone.

    The message keeps Python's own wording (``build_pipeline() got an unexpected keyword
    argument 'batch_sz'``) and names the option and the import path.
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return  # a builtin or extension without a signature: its call will tell
    try:
        signature.bind(**options)
    except TypeError as exc:
        name = getattr(func, "__name__", target.partition(":")[2])
        raise ConfigError(f"{what}={target!r} rejected options {options!r}: {name}() {exc}; "
                          f"its parameters are {list(signature.parameters)}") from None


def _callable(path: str, what: str) -> Callable[..., Any]:
    obj = load_object(path, what)
    if not callable(obj):
        raise ConfigError(f"{what}={path!r} is a {type(obj).__name__}, not a class or function")
    return obj


def preflight(cfg: LaunchConfig, role: str) -> None:
    """Check every plug-in the job names; ``role`` is the node's (``data``, ``dnn``, ``homogeneous``).

    Raises:
        ConfigError: naming the option, its value and what is wrong.
    """
    builder = PipelineSpec(cfg.data.pipeline, cfg.data.pipeline_options).resolve()
    check_call(builder, dict(cfg.data.pipeline_options), "pipeline", cfg.data.pipeline)
    check_call(_callable(cfg.model.model, "model"), dict(cfg.model.model_options), "model", cfg.model.model)
    _callable(cfg.model.step, "step")
    if cfg.model.evaluate:
        _callable(cfg.model.evaluate, "evaluate")

    _callable(cfg.model.optimizer_path(), "optimizer")
    if role in ("dnn", "homogeneous"):
        from dnn_worker.device.ddp import resolve_backend

        resolve_backend(cfg.dnn.ddp_backend)  # nccl without CUDA, smddp without its library: fail now
    if role == "homogeneous":
        # the pipeline runs here: build it now (values, data, finish stage), not at the first batch
        PipelineSpec(cfg.data.pipeline, cfg.data.pipeline_options).load().finish_target()
    log.info("options checked: pipeline %s, model %s, step %s, evaluate %s, optimizer %s", cfg.data.pipeline,
             cfg.model.model, cfg.model.step, cfg.model.evaluate or "(none)", cfg.model.optimizer)
