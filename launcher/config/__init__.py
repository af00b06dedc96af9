"""The launcher's options: ``LaunchConfig``, one frozen section per concern, read from the job's
hyperparameters (launch_config), and the sections with their checks (sections)."""
from __future__ import annotations

from .launch_config import LaunchConfig, load_object
from .sections import (OPTIMIZERS, AdviceSection, CheckpointSection, DataSection, DnnSection, ElasticSection,
                       EmulateSection, JobSection, ModelSection, RolesSection, ServeSection, TrainSection)

__all__ = ["AdviceSection", "CheckpointSection", "DataSection", "DnnSection", "ElasticSection", "EmulateSection",
           "JobSection", "LaunchConfig", "ModelSection", "OPTIMIZERS", "RolesSection", "ServeSection", "TrainSection",
           "load_object"]
