"""Actuators: what adds data nodes to a running job and releases drained ones.

One small interface (:class:`Actuator`): ``scale_out(count, ctx)`` starts ``count`` data nodes
that join the job's registry and returns an id for each; ``scale_in(drained, ctx)`` releases
nodes whose servers the autoscaler already drained (they left the registry and finished what
they owed, so releasing them loses nothing). The autoscaler never stops a server any other way.

* :class:`LocalActuator`: ``hetero serve --join REGISTRY`` processes on this machine (``hetero
  local --autoscale``); a drained one exits by itself.
* :class:`CommandActuator`: shell hooks for any fleet (an EC2 Auto Scaling group, ECS, Kubernetes),
  given the count and the registry in the environment (``HETERO_SCALE_COUNT``,
  ``HETERO_REGISTRY``, ...) and as ``{count}`` / ``{registry}`` / ``{target}`` / ``{servers}``.
* ``sagemaker`` (``launcher.autoscale.sagemaker_actuator``): data-only training jobs that join this one.
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

from data_service.membership.registry import Entry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScaleContext:
    """What an actuator is told with each action."""

    registry: str
    nodes: int            # data nodes serving when the decision was taken
    target: int           # data nodes the decision aims at
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


class PartialScaleOut(Exception):
    """A scale-out that failed after starting some nodes: ``created`` are their ids (they serve and
    cost like any other, so the controller keeps them to release at a scale-in)."""

    def __init__(self, created: Sequence[str], asked: int, cause: BaseException) -> None:
        super().__init__(f"started {len(created)} of {asked} data node(s), then: {cause}")
        self.created, self.asked, self.cause = list(created), asked, cause


class Actuator(Protocol):
    """Adds data nodes and releases drained ones (see the module docstring)."""

    name: str

    def scale_out(self, count: int, ctx: ScaleContext) -> list[str]:
        """Start ``count`` data nodes joining ``ctx.registry``; ids of what was started. A failure
        after some started raises :class:`PartialScaleOut` with their ids."""

    def scale_in(self, drained: Sequence[Entry], ctx: ScaleContext) -> None:
        """Release the nodes of ``drained`` servers (already drained and gone from the registry)."""

    def close(self) -> None:
        """Stop watching what was started (started nodes keep serving until drained or the job ends)."""


class DrainingActuator(Actuator, Protocol):
    """An actuator that also scales in by itself (the controller's ``drain_by_actuator``)."""

    def drain(self, count: int, ctx: ScaleContext) -> list[str]:
        """Stop ``count`` of the nodes it started (each leaves the registry first); ids of those stopped."""


class LocalActuator:
    """``hetero serve PIPELINE --join REGISTRY`` processes on this machine.

    Each runs in a session of its own (a rank-0 restart does not stop it) and writes its log to
    ``log_dir``; the job's end-of-training shutdown stops it with the job's other servers.
    """

    name = "local"

    def __init__(self, pipeline: str, options: dict, token: str, registry: str, *, workers: int = 1,
                 ttl_s: float = 15.0, log_dir: str | os.PathLike = "", host: str = "127.0.0.1") -> None:
        self.pipeline, self.options, self.token, self.registry = pipeline, dict(options), token, registry
        self.workers, self.ttl_s, self.host = workers, ttl_s, host
        self.log_dir = Path(log_dir or Path(registry) / "autoscale" / "logs")
        self.procs: list[subprocess.Popen] = []

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "hetero", "--log-level", "INFO", "serve", self.pipeline, "--host", self.host,
               "--port", "0", "--workers", str(self.workers), "--join", self.registry, "--advertise-host",
               self.host, "--ttl", str(self.ttl_s), "--no-probe"]
        for key, value in self.options.items():
            cmd += ["-o", f"{key}={json.dumps(value)}"]
        return cmd

    def scale_out(self, count: int, ctx: ScaleContext) -> list[str]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HETERO_JOB_TOKEN": self.token}
        ids = []
        for _ in range(count):
            name = f"serve-{time.strftime('%H%M%S')}-{len(self.procs)}"
            with open(self.log_dir / f"{name}.log", "ab") as out:
                proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.append(proc)
            ids.append(f"local-pid-{proc.pid}")
        self.reap()
        return ids

    def scale_in(self, drained: Sequence[Entry], ctx: ScaleContext) -> None:
        self.reap()  # a drained server exits by itself once it owes nothing

    def reap(self) -> None:
        """Collect the exit status of servers that ended."""
        self.procs = [p for p in self.procs if p.poll() is None]

    def close(self) -> None:
        self.reap()


class CommandActuator:
    """Shell hooks: ``scale_out_cmd`` adds nodes, ``scale_in_cmd`` (optional) releases drained ones.

    Each runs with ``HETERO_SCALE_ACTION`` (out/in), ``HETERO_SCALE_COUNT``, ``HETERO_SCALE_TARGET``,
    ``HETERO_SCALE_NODES``, ``HETERO_REGISTRY`` and, for a scale-in, ``HETERO_SCALE_SERVERS`` and
    ``HETERO_SCALE_SERVER_IDS`` (comma-separated) in its environment, the same as ``{count}``,
    ``{target}``, ``{nodes}``, ``{registry}``, ``{servers}``, ``{server_ids}`` in its text
    (shell-quoted). A hook that fails or runs past ``timeout_s`` is logged; the decision stands
    (a scale-out that never joins stops counting after the policy's ``join_timeout_s``).
    """

    name = "command"

    def __init__(self, scale_out_cmd: str, scale_in_cmd: str = "", timeout_s: float = 600.0) -> None:
        self.scale_out_cmd, self.scale_in_cmd, self.timeout_s = scale_out_cmd, scale_in_cmd, timeout_s
        self.runs: list[tuple[str, int | None]] = []  # (action, exit code; None: timed out)

    def scale_out(self, count: int, ctx: ScaleContext) -> list[str]:
        self._run("out", self.scale_out_cmd, count, ctx, [])
        return [f"hook-{len(self.runs)}-{i}" for i in range(count)]

    def scale_in(self, drained: Sequence[Entry], ctx: ScaleContext) -> None:
        if self.scale_in_cmd:
            self._run("in", self.scale_in_cmd, len(drained), ctx, drained)

    def close(self) -> None:
        pass

    def _run(self, action: str, template: str, count: int, ctx: ScaleContext, drained: Sequence[Entry]) -> None:
        values = {"count": str(count), "target": str(ctx.target), "nodes": str(ctx.nodes), "registry": ctx.registry,
                  "servers": ",".join(e.address for e in drained), "server_ids": ",".join(e.server_id for e in drained)}
        env = {**os.environ, "HETERO_SCALE_ACTION": action, "HETERO_SCALE_COUNT": values["count"],
               "HETERO_SCALE_TARGET": values["target"], "HETERO_SCALE_NODES": values["nodes"],
               "HETERO_REGISTRY": ctx.registry, "HETERO_SCALE_SERVERS": values["servers"],
               "HETERO_SCALE_SERVER_IDS": values["server_ids"]}
        command = template
        for key, value in values.items():
            command = command.replace("{" + key + "}", shlex.quote(value))
        try:
            done = subprocess.run(command, shell=True, env=env, timeout=self.timeout_s, capture_output=True,
                                  text=True, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            self.runs.append((action, None))
            log.warning("autoscale: the scale-%s hook ran past %g s and was stopped", action, self.timeout_s)
            return
        self.runs.append((action, done.returncode))
        if done.returncode != 0:
            log.warning("autoscale: the scale-%s hook exited with %d: %s", action, done.returncode,
                        (done.stderr or done.stdout).strip()[-500:])
        else:
            log.info("autoscale: scale-%s hook done (count %d)%s", action, count,
                     f": {done.stdout.strip()[-200:]}" if done.stdout.strip() else "")
