"""Check a job's channel input modes against what its pipeline can read.

SageMaker delivers a channel in ``File`` mode (copied to the node's disk before the job
starts) or ``FastFile`` mode (the same path, but files are streamed from S3 on first read:
no copy, and the job starts at once; the folder is read-only and a file's first read costs an
S3 round trip). A pipeline that cannot live with that (it writes beside its data, memory-maps
one huge file at random offsets, or re-lists the folder on every epoch) declares it on its
builder function::

    def build_pipeline(data_dir=None, ...):
        ...
    build_pipeline.input_modes = ("File",)

``input_modes`` lists the modes the builder supports; a builder without the attribute reads
either. ``hetero submit`` and the SDK builder refuse a FastFile channel for a builder that
lists only ``File`` before anything is sent.
"""
from __future__ import annotations

import logging

from hetero.sagemaker.spec import INPUT_MODES, JobSpec, SubmitError

log = logging.getLogger(__name__)

ATTRIBUTE = "input_modes"


def pipeline_of(spec: JobSpec) -> str:
    """The ``package.module:function`` the job's data servers will build (the launcher's default
    when the ``pipeline`` hyperparameter is not given)."""
    from launcher.config import DataSection

    return str(spec.hyperparameters.get("pipeline") or DataSection.pipeline)


def supported_modes(builder) -> tuple[str, ...]:
    """The input modes ``builder`` declares (all of :data:`INPUT_MODES` when it declares none).

    Raises:
        SubmitError: the declaration is not a list of known modes.
    """
    declared = getattr(builder, ATTRIBUTE, None)
    if declared is None:
        return INPUT_MODES
    modes = (declared,) if isinstance(declared, str) else tuple(declared)
    unknown = [m for m in modes if m not in INPUT_MODES]
    if unknown or not modes:
        raise SubmitError(f"pipeline builder {getattr(builder, '__qualname__', builder)!r} declares "
                          f"{ATTRIBUTE}={declared!r}; it must be a non-empty tuple of {INPUT_MODES}")
    return modes


def check_input_modes(spec: JobSpec) -> None:
    """Raise SubmitError when a channel's mode is one the job's pipeline cannot read.

    The pipeline is imported only when some channel is not in File mode (importing one can
    be slow). A pipeline that cannot be imported here (its code is only in the image) cannot
    be checked: a warning says so and the job goes ahead.
    """
    streamed = [c for c in spec.channels if c.input_mode != "File"]
    if not streamed:
        return
    target = pipeline_of(spec)
    from launcher.config import load_object

    try:
        builder = load_object(target, "pipeline")
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot check here"
        log.warning("cannot import pipeline %s here to check that it reads %s input (%s); submitting anyway",
                    target, "/".join(sorted({c.input_mode for c in streamed})), exc)
        return
    modes = supported_modes(builder)
    for channel in streamed:
        if channel.input_mode not in modes:
            raise SubmitError(f"channel {channel.name!r} uses {channel.input_mode} mode, but pipeline {target} "
                              f"reads only {'/'.join(modes)} ({ATTRIBUTE} = {modes!r} on the builder); use "
                              f"--input-mode {channel.name}=File, or a pipeline that supports {channel.input_mode}")
