"""The data-only job template the in-job SageMaker autoscaler starts its data nodes from.

``hetero autoscale JOB`` reads the running job (``DescribeTrainingJob``), makes the ``hetero
submit --join`` job of ONE data node from it (Managed Spot unless ``--on-demand``; a warm pool of
``--keep-alive`` seconds, SageMaker's ``KeepAlivePeriodInSeconds``, so a replacement starts in
seconds), checks the request against botocore's service model and the API's rules, and writes it
without its secret beside the job's registry (``launcher.autoscale.sagemaker_actuator.TEMPLATE_KEY``).
The job's rank 0 (``autoscale.actuator=sagemaker``) sends it with a fresh name and its own secret
for each node it adds.
"""
from __future__ import annotations

import copy
import json

from hetero.sagemaker.join import default_join_name, join_spec, registry_of
from hetero.sagemaker.request import build_request
from hetero.sagemaker.spec import DATA, Group, SubmitError
from hetero.sagemaker.validate import check_request
from launcher.autoscale.sagemaker_actuator import SECRET_ARN_ENV, SECRET_ENV, TEMPLATE_KEY

MAX_KEEP_ALIVE_S = 3600  # SageMaker's bound on KeepAlivePeriodInSeconds


def join_template(job: dict, *, region: str, instance_type: str | None = None, spot: bool = True,
                  keep_alive_s: int = 0, max_run_s: int = 86400) -> dict:
    """The CreateTrainingJob request template of one joining data node for running ``job``.

    Raises:
        SubmitError: the job cannot be joined, a bad keep-alive, or a request SageMaker would reject.
    """
    if not 0 <= keep_alive_s <= MAX_KEEP_ALIVE_S:
        raise SubmitError(f"--keep-alive {keep_alive_s} must be 0..{MAX_KEEP_ALIVE_S} seconds (0: no warm pool)")
    name = default_join_name(job["TrainingJobName"])
    group = Group("data_group", instance_type, 1, DATA) if instance_type else None
    spec = join_spec(job, job_name=name, group=group, vpc=None, role=None, image=None, output=None, region=region,
                     max_run_s=max_run_s, spot=spot, tags={"hetero:autoscale": "true"})
    request = build_request(spec)
    if keep_alive_s:
        request["ResourceConfig"]["KeepAlivePeriodInSeconds"] = keep_alive_s
    check_request(request)
    template = copy.deepcopy(request)
    template["Environment"] = {k: v for k, v in template.get("Environment", {}).items()
                               if k not in (SECRET_ENV, SECRET_ARN_ENV)}
    checkpoint = template.get("CheckpointConfig")
    if checkpoint:  # each data-only job gets its own checkpoint prefix (nothing is checkpointed: spot needs one)
        checkpoint["S3Uri"] = checkpoint["S3Uri"].replace(name, "{job}")
    return template


def write_template(job: dict, template: dict) -> str:
    """Write ``template`` beside running ``job``'s registry; returns its URL."""
    from data_service.storage import open_store

    store = open_store(registry_of(job), what="registry", create=True)
    store.write_bytes(TEMPLATE_KEY, json.dumps(template, indent=1, sort_keys=True).encode())
    return store.key_url(TEMPLATE_KEY)
