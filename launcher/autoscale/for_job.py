"""Rank 0's autoscaler for a job: the advisor and the autoscaler ``autoscale.*`` asks for.

``advice_and_autoscaler(job, rank)`` is what the trainer calls: no advice in mode ``off``, the live
advisor alone in ``advise``, and in ``act`` an :class:`~launcher.autoscale.controller.Autoscaler`
with the actuator the settings name, checked against the job's starting data group.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from data_service.errors import ConfigError

from .actuators import Actuator, CommandActuator, LocalActuator
from .controller import Autoscaler
from .settings import Settings


def make_actuator(settings: Settings, *, pipeline: str, pipeline_options: dict, token: str,
                  registry: str) -> Actuator:
    """The actuator ``settings.actuator`` names, for a job of ``pipeline`` with ``registry``."""
    if settings.actuator == "local":
        return LocalActuator(pipeline, pipeline_options, token, registry, workers=settings.workers,
                             ttl_s=settings.ttl_s)
    if settings.actuator == "command":
        return CommandActuator(settings.scale_out_cmd, settings.scale_in_cmd, settings.hook_timeout_s)
    from .sagemaker_actuator import SageMakerActuator

    return SageMakerActuator.from_registry(registry)


def advice_and_autoscaler(job, rank: int):
    """Rank 0's ``(LiveAdvisor or None, Autoscaler or None)`` for a ``launcher.train.trainer.TrainJob``:
    no advice in ``autoscale.mode=off``, an autoscaler only in ``act`` (and only with advice).

    Raises:
        ConfigError: see :func:`autoscaler_for`.
    """
    from ..advice.advisor import live_advisor

    mode = str((job.cfg.advice.autoscale_options or {}).get("mode", "advise"))
    advisor = None if mode == "off" else live_advisor(job, rank)
    if advisor is None or mode != "act":
        return advisor, None
    own = {a for h, a in zip(job.server_hosts, job.servers) if h in job.dnn_hosts}
    return advisor, autoscaler_for(job, [a for a in job.servers if a not in own], advisor.prices)


def autoscaler_for(job, fixed_data_nodes: Sequence[str], prices: Mapping[str, float]) -> Autoscaler:
    """Rank 0's autoscaler for a ``launcher.train.trainer.TrainJob`` in mode ``act``.

    Raises:
        ConfigError: bad settings, or the starting data group costs more than the $/h cap.
    """
    cfg = job.cfg
    settings = Settings.from_options(cfg.advice.autoscale_options, registry=cfg.elastic.registry)
    actuator = make_actuator(settings, pipeline=cfg.data.pipeline, pipeline_options=cfg.data.pipeline_options,
                             token=job.token, registry=cfg.elastic.registry)
    scaler = Autoscaler(settings, actuator, cfg.elastic.registry, job.token, fixed=fixed_data_nodes)
    kind = job.extra.get("data_instance_type", "")
    try:
        scaler.check_start(len(fixed_data_nodes), prices.get(kind), kind)
    except ConfigError:
        scaler.close(timeout=0.0)
        raise
    return scaler
