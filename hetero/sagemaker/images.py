"""Which training image a ``--framework-version`` names.

With a usable SageMaker SDK installed, its ``image_uris.retrieve`` answers (offline, from the
JSON it bundles: every region's account, the Python version of each release); otherwise the
tag table in ``request.py``. One image runs on every group, so it is the GPU flavour whenever
a group has GPUs (the CUDA libraries simply go unused on CPU instances).
"""
from __future__ import annotations

import logging

from hetero.sagemaker.request import framework_image
from hetero.sagemaker.sdk_version import sdk_problem
from hetero.sagemaker.spec import SubmitError

log = logging.getLogger(__name__)

SDK, TABLE = "sagemaker SDK image_uris", "built-in tag table"
_GPU_FAMILIES = ("ml.p", "ml.g")


def training_image(version: str, region: str, instance_types: list[str]) -> tuple[str, str]:
    """``(image URI, source)`` of the AWS PyTorch training image ``version`` in ``region``.

    ``source`` is :data:`SDK` or :data:`TABLE` (say it to the user: the table is kept by hand).

    Raises:
        SubmitError: neither source knows the version (or the table the region).
    """
    problem = sdk_problem()
    if problem is None:
        from sagemaker.core import image_uris

        try:
            flavour = next((t for t in instance_types if t.startswith(_GPU_FAMILIES)), instance_types[0])  # GPU first
            uri = image_uris.retrieve("pytorch", region, version=str(version), instance_type=flavour,
                                      image_scope="training")
            return uri, SDK
        except ValueError as exc:
            raise SubmitError(f"--framework-version {version!r}: {exc}; or pass the image with --image URI") from None
    log.info("training image from the %s (%s)", TABLE, problem)
    return framework_image(version, region), TABLE
