"""The job secret read from AWS Secrets Manager (moto) on every node at start."""
from __future__ import annotations

import socket

import boto3
import pytest

from data_service.errors import ConfigError
from launcher.job.jobsecret import ARN_VAR, SECRET_VAR, fetch_secret, region_of, with_job_secret
from launcher.job.jobtoken import derive_token, job_token

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}


@pytest.fixture
def aws(monkeypatch):
    from moto import mock_aws

    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield boto3.client("secretsmanager", region_name="eu-west-1")


def test_every_node_derives_the_same_token_from_the_stored_secret(aws):
    arn = aws.create_secret(Name="hetero-job", SecretString="s3cr3t-value")["ARN"]
    assert region_of(arn) == "eu-west-1"
    assert fetch_secret(arn) == "s3cr3t-value"
    environ = {ARN_VAR: arn, "TRAINING_JOB_NAME": "job-7"}
    filled = with_job_secret(environ)
    assert filled[SECRET_VAR] == "s3cr3t-value" and SECRET_VAR not in environ
    assert job_token(filled, "job-7") == derive_token("s3cr3t-value", "job-7")


def test_without_an_arn_nothing_is_fetched():
    def boom(arn):
        raise AssertionError("fetched")
    environ = {SECRET_VAR: "x"}
    assert with_job_secret(environ, fetch=boom) is environ


@pytest.mark.parametrize("make, message", [
    (lambda sm: sm.create_secret(Name="bin", SecretBinary=b"\x00\x01")["ARN"], "has no SecretString"),
    (lambda sm: "arn:aws:secretsmanager:eu-west-1:123456789012:secret:missing-AbCdEf",
     "ResourceNotFoundException; give the job's execution role secretsmanager:GetSecretValue"),
])
def test_unreadable_secrets_name_the_arn_and_the_fix(aws, make, message):
    arn = make(aws)
    with pytest.raises(ConfigError, match=message) as info:
        fetch_secret(arn)
    assert arn in str(info.value)


def test_both_variables_or_a_bad_arn_are_refused():
    with pytest.raises(ConfigError, match="both HETERO_JOB_SECRET and HETERO_JOB_SECRET_ARN"):
        with_job_secret({SECRET_VAR: "a", ARN_VAR: "arn:aws:secretsmanager:us-east-1:123456789012:secret:x"})
    with pytest.raises(ConfigError, match="is not a Secrets Manager secret ARN"):
        region_of("arn:aws:s3:::bucket")


@pytest.mark.slow
def test_a_local_job_whose_nodes_read_the_secret_from_secrets_manager(tmp_path, monkeypatch):
    """Two real node processes, each told only the ARN and a Secrets Manager endpoint (a moto server):
    both fetch the secret, derive the same token and the job completes."""
    from moto.server import ThreadedMotoServer

    from _launcher_helpers import SYNTHETIC_HPS, synth_data
    from hetero.local.runner import LocalCluster
    from hetero.local.tree import build_nodes

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        with socket.create_connection((host, port), timeout=5):
            pass
        endpoint = f"http://{host}:{port}"
        sm = boto3.client("secretsmanager", region_name="us-east-1", endpoint_url=endpoint, **{
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing"})
        arn = sm.create_secret(Name="hetero-job", SecretString="from-secrets-manager")["ARN"]
        data = synth_data(tmp_path / "data", 64, 0)
        hps = {**SYNTHETIC_HPS, "loader_workers": 0, "emulate_step_s": 0.01, "evaluate": ""}
        nodes = build_nodes(tmp_path / "nodes", 1, 1, False, data, hps, "secret-job")
        for node in nodes:
            del node.env[SECRET_VAR]
            node.env.update({ARN_VAR: arn, "AWS_ENDPOINT_URL_SECRETS_MANAGER": endpoint, **CREDS})
        cluster = LocalCluster(nodes, hps, tmp_path / "logs", echo=False)
        cluster.start()
        try:
            codes = cluster.wait(timeout_s=120)
        finally:
            cluster.stop()
        logs = {p.stem: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
        assert set(codes.values()) == {0}, logs
        for text in logs.values():
            assert f"job secret read from AWS Secrets Manager ({arn})" in text
            assert "from-secrets-manager" not in text and "no HETERO_JOB_SECRET" not in text
    finally:
        server.stop()


def test_a_node_that_cannot_read_the_secret_stops_with_the_reason(aws, tmp_path):
    import json

    from launcher.node import EXIT_CONFIG, main

    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps({
        "current_host": "algo-1", "current_group_name": "homogeneousCluster", "hosts": ["algo-1"],
        "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": "ml.p3.2xlarge",
                             "hosts": ["algo-1"]}]}))
    (config / "hyperparameters.json").write_text("{}")
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:gone-AbCdEf"
    environ = {ARN_VAR: arn, "TRAINING_JOB_NAME": "job-1", **CREDS}
    assert main([], environ=environ, root=str(tmp_path)) == EXIT_CONFIG
    reason = (tmp_path / "output" / "failure").read_text()
    assert arn in reason and "secretsmanager:GetSecretValue" in reason
