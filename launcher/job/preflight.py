"""Start-up checks of the job's plug-ins, on every node, before anything waits or trains.

A typo in an option must fail in seconds on the node that reads it, not after the DNN node
waited ``data_wait_s`` for data servers, nor after a whole training run (``evaluate`` is
first used at the end). Every import-path option (``pipeline``, ``model``, ``step``,
``evaluate``, ``optimizer``) is imported and checked callable, and the options given to the
pipeline builder and to the model are checked against their signatures. None of this needs
the training data, which a node outside the data group may not have; the pipeline itself
(values, data, its ``finish`` stage) is built by the data servers at their start and, in
homogeneous mode, here. On a DNN node the evaluation (``evaluate``; ``auto``: the model's
module's own) is also run on two of its own samples with a fresh model, when it takes
``limit``: an evaluation that does not fit the model fails here, not after training.
"""
from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any, Callable

from data_service.errors import ConfigError
from data_service.contract.pipeline import PipelineSpec
from data_service.contract.plugins import check_call, check_findable

from ..config import LaunchConfig, load_object

log = logging.getLogger(__name__)


def _callable(path: str, what: str) -> Callable[..., Any]:
    obj = load_object(path, what)
    if not callable(obj):
        raise ConfigError(f"{what}={path!r} is a {type(obj).__name__}, not a class or function")
    return obj


def check_findable_plugins(cfg: LaunchConfig) -> None:
    """Every plug-in module the job names exists (nothing of them runs): what a process that
    starts the nodes (``hetero local``) checks before it starts them.

    Raises:
        ConfigError: naming the option, the path and the fix.
    """
    named = [("pipeline", cfg.data.pipeline), ("model", cfg.model.model), ("step", cfg.model.step),
             ("evaluate", cfg.model.evaluate), ("optimizer", cfg.model.optimizer_path())]  # evaluate=auto: no path yet
    for what, path in named:
        if path and ":" in path:
            check_findable(path, what)


def preflight(cfg: LaunchConfig, role: str) -> None:
    """Check every plug-in the job names; ``role`` is the node's (``data``, ``dnn``, ``homogeneous``).

    Raises:
        ConfigError: naming the option, its value and what is wrong.
    """
    builder = PipelineSpec(cfg.data.pipeline, cfg.data.pipeline_options).resolve()
    check_call(builder, dict(cfg.data.pipeline_options), "pipeline", cfg.data.pipeline)
    check_call(_callable(cfg.model.model, "model"), dict(cfg.model.model_options), "model", cfg.model.model)
    _callable(cfg.model.step, "step")
    evaluate = cfg.model.evaluate_path()
    if evaluate:
        _callable(evaluate, "evaluate")

    _callable(cfg.model.optimizer_path(), "optimizer")
    if role in ("dnn", "homogeneous"):
        from dnn_worker.device.ddp import resolve_backend

        resolve_backend(cfg.dnn.ddp_backend)  # nccl without CUDA, smddp without its library: fail now
    if role == "homogeneous":
        # the pipeline runs here: build it now (values, data, finish stage), not at the first batch
        PipelineSpec(cfg.data.pipeline, cfg.data.pipeline_options).load().finish_target()
    evaluation = evaluate or ("none (evaluate= given)" if not cfg.model.evaluate else
                              f"none ({cfg.model.model.partition(':')[0]} has no evaluate function; "
                              "evaluate=pkg.module:function names one)")
    if evaluate and role in ("dnn", "homogeneous") and cfg.emulate.emulate_step_s <= 0:
        evaluation = check_evaluate(cfg, evaluate)
    log.info("options checked: pipeline %s, model %s, step %s, evaluate %s, optimizer %s", cfg.data.pipeline,
             cfg.model.model, cfg.model.step, evaluation, cfg.model.optimizer)


PROBE_SAMPLES = 2  # samples the evaluation runs on at the start (evaluate(..., limit=PROBE_SAMPLES))


def check_evaluate(cfg: LaunchConfig, evaluate: str) -> str:
    """Run the evaluation on :data:`PROBE_SAMPLES` of its own samples with a fresh model (on the CPU),
    so an evaluation that does not fit the model fails now rather than after training; returns
    what the start-up line says of it. Only an evaluation taking ``limit`` (samples) is run: one
    without it is checked at the end of training only.

    Raises:
        ConfigError: the evaluation failed on the model, naming both and what to pass instead.
    """
    import torch

    function = load_object(evaluate, "evaluate")
    try:
        accepts = "limit" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        accepts = False
    if not accepts:
        return f"{evaluate} (it takes no limit=: not tried before training)"
    model = load_object(cfg.model.model, "model")(**cfg.model.model_options)
    try:
        with torch.no_grad():
            result = function(model, torch.device("cpu"), limit=PROBE_SAMPLES)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the user's evaluation raises is the mismatch
        module = cfg.model.model.partition(":")[0]
        own = f"{module}:evaluate"
        fix = (f"set evaluate={own} (the model's module's own) or evaluate= (no evaluation)"
               if own != evaluate and callable(getattr(importlib.import_module(module), "evaluate", None))
               else "set evaluate= to an evaluation that takes this model's inputs, or evaluate= (no evaluation)")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"evaluate={evaluate!r} does not fit model={cfg.model.model!r}: on {PROBE_SAMPLES} of its "
                          f"samples it failed with {type(exc).__name__}: {first}; {fix}") from None
    if result is None:
        return f"{evaluate} (it found no evaluation data: no test accuracy)"
    return f"{evaluate} (tried on {PROBE_SAMPLES} samples)"
