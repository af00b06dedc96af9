"""The job token: derived on every node, never sent in clear.

Every node of one job computes the same token on its own::

    token = HMAC-SHA256(key = secret, message = "hetero-data-service/v1/job-token:" + job name)

as 64 lowercase hex characters, where

* ``secret`` is the ``HETERO_JOB_SECRET`` variable (``Estimator(environment=...)``; the launcher
  fills it from AWS Secrets Manager when ``HETERO_JOB_SECRET_ARN`` is set, see ``jobsecret.py``)
  or, failing that, the ``job_secret`` hyperparameter;
* the job name is ``TRAINING_JOB_NAME`` (set by SageMaker), ``SM_TRAINING_ENV["job_name"]``,
  or the ``sagemaker_job_name`` / ``job_name`` hyperparameter.

The job name makes the token differ per job even when a secret is reused. Data servers check
the bearer token on control calls and an HMAC proof over a fresh nonce on the data plane, so
the token itself never crosses the network. Without a secret the token is derived from the
job name alone: anyone who knows the name can compute it, so a warning is logged. An explicit
``HETERO_JOB_TOKEN`` overrides the derivation (for ``hetero serve``-style manual set-ups).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Mapping

from data_service.errors import ConfigError

log = logging.getLogger(__name__)

CONTEXT = b"hetero-data-service/v1/job-token:"


def derive_token(secret: str, job_name: str) -> str:
    """HMAC-SHA256(secret, CONTEXT + job_name) in hex."""
    return hmac.new(secret.encode(), CONTEXT + job_name.encode(), hashlib.sha256).hexdigest()


def job_token(environ: Mapping[str, str], job_name: str, secret_hp: str = "") -> str:
    """The token for this job (see the module docstring).

    Raises:
        ConfigError: no job name anywhere and no explicit HETERO_JOB_TOKEN.
    """
    explicit = environ.get("HETERO_JOB_TOKEN", "")
    if explicit:
        return explicit
    if not job_name:
        raise ConfigError("no training job name: TRAINING_JOB_NAME, SM_TRAINING_ENV and the job_name "
                          "hyperparameter are all unset, so nodes cannot agree on a job token; set "
                          "job_name (or HETERO_JOB_TOKEN)")
    secret = environ.get("HETERO_JOB_SECRET", "") or secret_hp
    if not secret:
        log.warning("no HETERO_JOB_SECRET: the job token is derived from the job name %r alone, which "
                    "anyone who knows the name can do; set HETERO_JOB_SECRET for a private token", job_name)
    return derive_token(secret, job_name)
