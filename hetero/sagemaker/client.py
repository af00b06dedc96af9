"""Submit training jobs with boto3: check every request, upload the code, create the jobs.

Nothing reaches AWS until every request of the batch has passed ``validate.check_request``
and the source archive has been built, so bad input fails fast and leaves nothing behind.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, cast

from hetero.sagemaker.input_modes import check_input_modes
from hetero.sagemaker.request import build_request
from hetero.sagemaker.source import build_sourcedir, upload_source
from hetero.sagemaker.spec import JobSpec, SubmitError
from hetero.sagemaker.validate import check_request

log = logging.getLogger(__name__)


def exit_status(tool: str, call: Callable[[], int], user_errors: tuple[type[Exception], ...]) -> int:
    """A command's exit status: ``call()``'s, or 2 for one of ``user_errors`` (bad input) and 1 for a call
    AWS refused or botocore could not make; either is printed to stderr after ``tool``'s name."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call()
    except user_errors as exc:
        print(f"{tool}: {exc}", file=sys.stderr)
        return 2
    except (BotoCoreError, ClientError) as exc:
        print(f"{tool}: AWS refused a call: {exc}", file=sys.stderr)
        return 1


def resolve_region(region: str | None) -> str:
    """``region``, else the one boto3 finds (AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config)."""
    if region:
        return region
    import boto3

    found = boto3.session.Session().region_name
    if not found:
        raise SubmitError("no AWS region: pass --region (e.g. us-east-1) or set AWS_DEFAULT_REGION")
    return found


@dataclass
class Clients:
    """Lazily made boto3 clients for one region (and optional endpoint, e.g. a moto server).

    Attributes:
        region: AWS region.
        endpoint_url: send every call there instead of AWS (tests, moto).
    """

    region: str
    endpoint_url: str | None = None
    _made: dict = field(default_factory=dict, repr=False)

    def _client(self, service: str):
        if service not in self._made:
            import boto3
            from botocore.config import Config

            config = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=10, read_timeout=60)
            self._made[service] = boto3.session.Session(region_name=self.region).client(
                service, endpoint_url=self.endpoint_url, config=config)
        return self._made[service]

    @property
    def sagemaker(self):
        """The SageMaker client."""
        return self._client("sagemaker")

    @property
    def s3(self):
        """The S3 client."""
        return self._client("s3")

    @property
    def logs(self):
        """The CloudWatch Logs client."""
        return self._client("logs")


def prepare(specs: list[JobSpec]) -> list[dict]:
    """Build and check the request of every spec (no AWS call); raise on the first bad one."""
    for spec in specs:
        check_input_modes(spec)
    requests = [build_request(spec) for spec in specs]
    names = [r["TrainingJobName"] for r in requests]
    if len(set(names)) != len(names):
        raise SubmitError(f"job names must differ within one submission, got {names}")
    for request in requests:
        check_request(request)
    return requests


def submit(specs: list[JobSpec], clients: Clients, source_root: str | Path | None = None) -> list[str]:
    """Submit ``specs`` (one job, or a hetero + homogeneous pair).

    Args:
        specs: the jobs; those with ``source_s3`` get this repository's code uploaded there.
        clients: boto3 clients to use.
        source_root: checkout to package (default: the one this package runs from).

    Returns:
        The TrainingJobArn of each job, in order.

    Raises:
        SubmitError: a request is invalid or the source dir has no entry point (before any call).
        botocore.exceptions.ClientError: AWS refused a call.
    """
    requests = prepare(specs)
    archive = build_sourcedir(source_root) if any(spec.source_s3 for spec in specs) else None
    uploaded = set()
    arns = []
    for spec, request in zip(specs, requests):
        if spec.source_s3 and spec.source_s3 not in uploaded:
            data, digest = cast("tuple[bytes, str]", archive)  # built above: a spec has a source_s3
            upload_source(clients.s3, data, spec.source_s3, digest)
            uploaded.add(spec.source_s3)
        response = clients.sagemaker.create_training_job(**request)
        log.info("created training job %s (%s)", spec.job_name, response["TrainingJobArn"])
        arns.append(response["TrainingJobArn"])
    return arns
