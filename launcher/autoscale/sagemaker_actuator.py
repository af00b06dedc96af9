"""The SageMaker actuator: data-only training jobs that join this running job.

Each scale-out node is one data-only training job of one instance (the ``hetero submit --join``
job): its data server registers in this job's registry with a proof of this job's token, the
consumers start using it, and when the autoscaler drains it the server leaves and the job ends by
itself (a joined data node's idle end), so a scale-in releases it with nothing lost. A Spot
interruption of such a job is the same drain: SageMaker's SIGTERM makes its server leave the
registry first and finish what it owes.

The CreateTrainingJob request comes from a template beside the registry,
``<registry>/autoscale/join_request.json``, that ``hetero autoscale JOB`` writes once the job
runs (made from the running job's description, Managed Spot and the warm pool's
``KeepAlivePeriodInSeconds`` as asked, checked against botocore's service model, with no secret
in it). Each request takes a fresh job name and this job's own secret (``HETERO_JOB_SECRET`` or
``HETERO_JOB_SECRET_ARN`` from its environment).
"""
from __future__ import annotations

import copy
import json
import logging
import os
import re
import secrets
import time
from typing import Any, Sequence

from data_service.errors import ConfigError
from data_service.membership.registry import Entry
from data_service.storage import StoreError, open_store

from .actuators import PartialScaleOut, ScaleContext

log = logging.getLogger(__name__)

TEMPLATE_KEY = "autoscale/join_request.json"
SECRET_ENV, SECRET_ARN_ENV = "HETERO_JOB_SECRET", "HETERO_JOB_SECRET_ARN"


def read_template(registry: str) -> dict | None:
    """The data-only job's request template beside ``registry`` (None: not written yet)."""
    store = open_store(registry, what="registry", request_timeout_s=5.0, attempts=2, deadline_s=10.0,
                       backoff_max_s=0.5)
    try:
        return json.loads(store.read(TEMPLATE_KEY))
    except StoreError as exc:
        if exc.missing:
            return None
        raise


_NAME_OK = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")  # SageMaker's TrainingJobName rule


def job_name(template: dict, index: int, now: float | None = None, tag: str | None = None) -> str:
    """``<joined job>-as-<YYMMDDHHMMSS>-<tag>-<i>``, within SageMaker's 63-character name rule.

    The date and time and a random ``tag`` (one per scale-out; a controller that restarts within
    the same second draws another) keep names apart across days, restarts and scale-outs, since
    SageMaker refuses a name it has seen in the account and region before.
    """
    base = re.sub(r"[^a-zA-Z0-9-]+", "-", str(template.get("HyperParameters", {}).get("job_name") or "hetero"))
    tag = tag or secrets.token_hex(3)
    suffix = time.strftime("-as-%y%m%d%H%M%S", time.gmtime(now)) + f"-{tag}-{index}"
    base = base[:63 - len(suffix)].strip("-") or "hetero"
    name = base + suffix
    if not _NAME_OK.match(name):  # only an index past 10^20 gets here
        raise ConfigError(f"data-only job name {name!r} breaks SageMaker's rule {_NAME_OK.pattern}")
    return name


def request_for(template: dict, name: str, environ: dict | None = None) -> dict:
    """The CreateTrainingJob request of one data-only job named ``name`` from ``template``.

    Raises:
        ConfigError: this job's environment has no secret to give the joining job.
    """
    env = os.environ if environ is None else environ
    req = copy.deepcopy(template)
    req["TrainingJobName"] = name
    req.setdefault("HyperParameters", {})["sagemaker_job_name"] = name
    environment = {k: v for k, v in req.get("Environment", {}).items() if k not in (SECRET_ENV, SECRET_ARN_ENV)}
    if env.get(SECRET_ARN_ENV):
        environment[SECRET_ARN_ENV] = env[SECRET_ARN_ENV]
    elif env.get(SECRET_ENV):
        environment[SECRET_ENV] = env[SECRET_ENV]
    else:
        raise ConfigError(f"autoscale.actuator=sagemaker: this job has neither {SECRET_ENV} nor {SECRET_ARN_ENV}: "
                          "the joining jobs could not derive its token; submit it with hetero submit")
    req["Environment"] = environment
    checkpoint = req.get("CheckpointConfig")
    if checkpoint and "{job}" in checkpoint.get("S3Uri", ""):
        checkpoint["S3Uri"] = checkpoint["S3Uri"].replace("{job}", name)
    return req


class SageMakerActuator:
    """Starts data-only jobs from the template (see the module docstring)."""

    name = "sagemaker"

    def __init__(self, registry: str, client: Any = None, template: dict | None = None) -> None:
        self.registry = registry
        self._client = client
        self.template = template
        self.jobs: list[str] = []

    @classmethod
    def from_registry(cls, registry: str, client: Any = None) -> "SageMakerActuator":
        return cls(registry, client)

    @property
    def client(self):
        if self._client is None:
            import boto3

            self._client = boto3.client("sagemaker")
        return self._client

    def scale_out(self, count: int, ctx: ScaleContext) -> list[str]:
        template = self.template or read_template(self.registry)
        if template is None:
            log.warning("autoscale: no data-only job template at %s/%s: run `hetero autoscale JOB` once the job "
                        "runs; nothing started", self.registry, TEMPLATE_KEY)
            return []
        self.template = template
        names: list[str] = []
        tag = secrets.token_hex(3)
        for i in range(count):
            name = job_name(template, i, tag=tag)
            try:
                self.client.create_training_job(**request_for(template, name))
            except Exception as exc:
                # the jobs already created run and bill: their ids go back so a scale-in can stop them
                raise PartialScaleOut(names, count, exc) from exc
            names.append(name)
            self.jobs.append(name)
        return names

    def scale_in(self, drained: Sequence[Entry], ctx: ScaleContext) -> None:
        """Nothing to call: a drained joined node's job ends by itself (into its warm pool, if any)."""

    def drain(self, count: int, ctx: ScaleContext) -> list[str]:
        """Stop the ``count`` newest data-only jobs started (from outside the job's network, where its
        servers cannot be asked directly): SageMaker's SIGTERM makes each server leave the registry
        first and finish what it owes, as a Spot interruption does. Returns the jobs stopped."""
        stopped = list(reversed(self.jobs[-count:])) if count > 0 else []
        for name in stopped:
            try:
                self.client.stop_training_job(TrainingJobName=name)
            except Exception as exc:  # noqa: BLE001 - ended already (a Spot loss, its own end): nothing to stop
                log.warning("autoscale: could not stop data-only job %s: %s", name, exc)
        self.jobs = [j for j in self.jobs if j not in stopped]
        return stopped

    def close(self) -> None:
        pass
