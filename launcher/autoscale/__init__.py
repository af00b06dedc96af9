"""The autoscaler: rank 0 acts on the live advice within a budget (docs/autoscale.md).

``policy`` (pure: figures in, a decision out), ``settings`` (the ``autoscale.*`` options),
``actuators`` (local processes, command hooks), ``sagemaker`` (data-only jobs joining this one),
``state`` (kept beside the registry), ``controller`` (the advice in, decisions logged and acted on),
``for_job`` (rank 0's advisor and autoscaler for a job).
"""
from __future__ import annotations

from .actuators import Actuator, CommandActuator, LocalActuator, ScaleContext
from .controller import Autoscaler
from .for_job import advice_and_autoscaler, autoscaler_for, make_actuator
from .policy import Decision, Demand, Limits, State, decide
from .settings import Settings

__all__ = ["Actuator", "Autoscaler", "CommandActuator", "Decision", "Demand", "Limits", "LocalActuator",
           "ScaleContext", "Settings", "State", "advice_and_autoscaler", "autoscaler_for", "decide", "make_actuator"]
