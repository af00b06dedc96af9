"""The image pipeline under its example import path; it lives in :mod:`data_service.pipelines.images`.

``--hp pipeline=examples.imagefolder:build_pipeline`` and
``--hp pipeline=data_service.pipelines.images:build_pipeline`` are the same pipeline.
"""
from data_service.pipelines.images import *  # noqa: F401,F403
from data_service.pipelines.images import (  # noqa: F401  (names the star import leaves out)
    Augment, CorruptImageError, ImageFolder, _some, build_pipeline, collate, collate_finished_on_server, count_classes,
    data_root, decode, evaluate, finish, prepare, resnet18, scan, train_step)
