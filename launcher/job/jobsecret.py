"""Fetch the job secret from AWS Secrets Manager when the job names one.

``hetero submit --job-secret-arn ARN`` sends only ``HETERO_JOB_SECRET_ARN=ARN``; every node
reads the secret's ``SecretString`` at start with the job's execution role (which needs
``secretsmanager:GetSecretValue`` on the ARN, and ``kms:Decrypt`` when a customer-managed key
encrypts it) and derives the job token from it as from ``HETERO_JOB_SECRET``. The value never
appears in the CreateTrainingJob request, DescribeTrainingJob or the logs.
"""
from __future__ import annotations

import logging
from typing import Mapping

from data_service.errors import ConfigError

log = logging.getLogger(__name__)

SECRET_VAR = "HETERO_JOB_SECRET"
ARN_VAR = "HETERO_JOB_SECRET_ARN"
PERMISSION = "secretsmanager:GetSecretValue"


def region_of(arn: str) -> str:
    """The region field of a Secrets Manager ARN (``arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME``)."""
    parts = arn.split(":")
    if len(parts) < 7 or parts[0] != "arn" or parts[2] != "secretsmanager" or parts[5] != "secret" or not parts[3]:
        raise ConfigError(f"{ARN_VAR}={arn!r} is not a Secrets Manager secret ARN like "
                          "arn:aws:secretsmanager:us-east-1:123456789012:secret:hetero-job-AbCdEf")
    return parts[3]


def fetch_secret(arn: str, timeout_s: float = 20.0) -> str:
    """The ``SecretString`` of ``arn``, read with this node's AWS credentials.

    Each attempt is bounded by ``timeout_s`` (connect and read), with at most 4 attempts.

    Raises:
        ConfigError: boto3 missing, access denied, no such secret, a binary or empty secret,
            or AWS unreachable; the message names the ARN and the fix.
    """
    region = region_of(arn)
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise ConfigError(f"{ARN_VAR} is set but boto3 is not installed in this image; pip install boto3 "
                          f"(the AWS training images have it) or pass the secret another way") from None
    config = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 4, "mode": "standard"})
    client = boto3.session.Session(region_name=region).client("secretsmanager", config=config)
    try:
        response = client.get_secret_value(SecretId=arn)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise ConfigError(f"cannot read the job secret {arn}: {code or exc}; give the job's execution role "
                          f"{PERMISSION} on it (and kms:Decrypt on its key), and check the ARN") from None
    except BotoCoreError as exc:
        raise ConfigError(f"cannot read the job secret {arn}: {exc}; the node needs AWS credentials and a "
                          f"route to Secrets Manager in {region} (a VPC endpoint in a private subnet)") from None
    value = response.get("SecretString")
    if not value:
        raise ConfigError(f"the job secret {arn} has no SecretString (binary or empty); store the secret as "
                          "a plain string, e.g. aws secretsmanager put-secret-value --secret-string ...")
    return value


def with_job_secret(environ: Mapping[str, str], fetch=fetch_secret) -> Mapping[str, str]:
    """``environ`` with ``HETERO_JOB_SECRET`` filled from Secrets Manager when ``HETERO_JOB_SECRET_ARN``
    is set; ``environ`` itself otherwise.

    Raises:
        ConfigError: both variables are set (which one is meant?), or the fetch failed.
    """
    arn = environ.get(ARN_VAR, "")
    if not arn:
        return environ
    if environ.get(SECRET_VAR):
        raise ConfigError(f"both {SECRET_VAR} and {ARN_VAR} are set; set only one (the ARN keeps the secret "
                          "out of the job's description)")
    secret = fetch(arn)
    log.info("job secret read from AWS Secrets Manager (%s)", arn)
    return {**environ, SECRET_VAR: secret}
