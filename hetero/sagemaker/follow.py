"""Follow submitted jobs to the end, stream their logs, read metrics.json and price the run.

The trainer writes ``metrics.json`` to SM_OUTPUT_DATA_DIR (/opt/ml/output/data), which
SageMaker uploads as ``<output>/<job>/output/output.tar.gz``; files in /opt/ml/model end
up in ``model.tar.gz`` beside it. Both archives are searched.
"""
from __future__ import annotations

import io
import json
import logging
import tarfile
import time
from typing import IO, Callable, cast

from data_service.errors import DataServiceError
from hetero.sagemaker.source import split_s3
from launcher.metric_lines import JobMetrics

log = logging.getLogger(__name__)

TERMINAL = {"Completed", "Failed", "Stopped"}
LOG_GROUP = "/aws/sagemaker/TrainingJobs"


class WaitTimeout(DataServiceError, TimeoutError):
    """A job did not finish before the deadline (it keeps running; stop it or wait again)."""


class LogTail:
    """Incremental reader of a job's CloudWatch log streams (``<job>/algo-N-...``)."""

    def __init__(self, logs, job_name: str) -> None:
        self.logs, self.job_name = logs, job_name
        self.tokens: dict[str, str | None] = {}

    def poll(self, max_pages: int = 20) -> list[str]:
        """New log lines since the last poll, each prefixed by its host; [] before logs exist."""
        try:
            streams = self.logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{self.job_name}/")
        except self.logs.exceptions.ResourceNotFoundException:
            return []
        lines = []
        for stream in streams.get("logStreams", []):
            name = stream["logStreamName"]
            host = name.split("/", 1)[-1]
            for _ in range(max_pages):
                kwargs = {"logGroupName": LOG_GROUP, "logStreamName": name, "startFromHead": True}
                if self.tokens.get(name):
                    kwargs["nextToken"] = self.tokens[name]
                page = self.logs.get_log_events(**kwargs)
                lines += [f"[{host}] {event['message'].rstrip()}" for event in page.get("events", [])]
                token = page.get("nextForwardToken")
                if not token or token == self.tokens.get(name):
                    break
                self.tokens[name] = token
        return lines


def wait(clients, job_names: list[str], timeout_s: float, poll_s: float = 30.0,
         on_log: Callable[[str], None] | None = None, sleep=time.sleep, clock=time.monotonic) -> dict[str, dict]:
    """Poll the jobs until all are Completed/Failed/Stopped, streaming logs to ``on_log``.

    Args:
        clients: hetero.sagemaker.client.Clients.
        job_names: jobs to follow.
        timeout_s: deadline for all of them together.
        poll_s: seconds between polls.
        on_log: called with each new log line (None: no log streaming).

    Returns:
        job name -> final DescribeTrainingJob response.

    Raises:
        WaitTimeout: the deadline passed first.
    """
    deadline = clock() + timeout_s
    tails = {name: LogTail(clients.logs, name) for name in job_names} if on_log else {}
    final: dict[str, dict] = {}
    last_status: dict[str, str] = {}
    while True:
        for name in job_names:
            if name in final:
                continue
            desc = clients.sagemaker.describe_training_job(TrainingJobName=name)
            status = f"{desc['TrainingJobStatus']}/{desc.get('SecondaryStatus', '')}"
            if status != last_status.get(name):
                log.info("%s: %s", name, status)
                last_status[name] = status
            if on_log is not None and name in tails:  # tails: made only with on_log
                for line in tails[name].poll():
                    on_log(line)
            if desc["TrainingJobStatus"] in TERMINAL:
                final[name] = desc
        if len(final) == len(job_names):
            return final
        left = deadline - clock()
        if left <= 0:
            pending = [n for n in job_names if n not in final]
            raise WaitTimeout(f"jobs {pending} still running after {timeout_s:.0f} s; they keep running: "
                              f"check them with `aws sagemaker describe-training-job` or raise --wait-timeout")
        sleep(min(poll_s, left))


def artifact_uris(desc: dict) -> list[str]:
    """Where the job's output archives are: output.tar.gz first, then model.tar.gz."""
    base = f"{desc['OutputDataConfig']['S3OutputPath'].rstrip('/')}/{desc['TrainingJobName']}/output"
    uris = [f"{base}/output.tar.gz", f"{base}/model.tar.gz"]
    model = desc.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    if model and model not in uris:
        uris.append(model)
    return uris


def fetch_metrics(s3, desc: dict) -> JobMetrics | None:
    """metrics.json of a finished job, or None when no archive holds one.

    When several are found (one per node), the first with a step time wins.
    """
    found: list[JobMetrics] = []
    for uri in artifact_uris(desc):
        bucket, key = split_s3(uri)
        try:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except (s3.exceptions.NoSuchKey, s3.exceptions.NoSuchBucket):
            continue
        try:
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                for member in tar.getmembers():
                    if member.isfile() and member.name.rsplit("/", 1)[-1] == "metrics.json":
                        text = cast(IO[bytes], tar.extractfile(member)).read()  # a file: has one
                        found.append(JobMetrics.from_json(json.loads(text)))
        except (tarfile.TarError, ValueError) as exc:  # ValueError: not JSON, or not a metrics record
            log.warning("cannot read metrics.json from %s: %s", uri, exc)
    timed = [m for m in found if m.avg_step_time_s]
    return (timed or found)[0] if found else None


def cluster_of(desc: dict) -> list[tuple[str, int]]:
    """``[(instance_type, count)]`` from a DescribeTrainingJob response."""
    res = desc["ResourceConfig"]
    if res.get("InstanceGroups"):
        return [(g["InstanceType"], g["InstanceCount"]) for g in res["InstanceGroups"]]
    return [(res["InstanceType"], res["InstanceCount"])]
