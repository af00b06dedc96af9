"""Split this machine's cores between a data node and the jobs it feeds, with CPU quotas (cgroup v1).

A benchmark that runs a data node and the training jobs it feeds on one machine lets the jobs'
own CPU (receiving, checking and auditing batches) come out of the node's cores, which on a real
cluster it never does: the jobs run on GPU nodes. ``CpuSplit`` gives the data node a quota of
``node_cores`` (its server and every worker: processes started inside ``node()`` inherit it) and
the jobs, this process, the rest. Where the cpu controller cannot be written (not root, no cgroup
v1 cpu hierarchy), ``available`` is False and nothing is split.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


class CpuSplit:
    """Two cpu cgroups: the node's (``node_cores`` of quota) and the jobs' (the rest of the cores).

    Args:
        node_cores: the data node's cores (fractions allowed), less than this machine's.
    """

    def __init__(self, node_cores: float) -> None:
        cores = len(os.sched_getaffinity(0))
        if not 0 < node_cores < cores:
            raise ValueError(f"node_cores={node_cores} must be > 0 and below this machine's {cores} cores")
        self.node_cores = node_cores
        self.jobs_cores = cores - node_cores
        tag = f"hetero-bench-{os.getpid()}"
        self._home = _own_group()
        self._node, self._jobs = self._home / f"{tag}-node", self._home / f"{tag}-jobs"
        self.available = False
        try:
            for group, share in ((self._node, node_cores), (self._jobs, self.jobs_cores)):
                group.mkdir(exist_ok=True)
                (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (group / "cpu.cfs_quota_us").write_text(str(int(share * PERIOD_US)))
            self._move(self._jobs)
            self.available = True
        except OSError:
            self.close()

    def node(self) -> contextlib.AbstractContextManager[None]:
        """Processes started inside this block run in the data node's cgroup."""
        return self._inside(self._node)

    def unlimited(self) -> contextlib.AbstractContextManager[None]:
        """This process runs without the jobs' quota inside this block (work outside the measured span)."""
        return self._inside(self._home)

    @contextlib.contextmanager
    def _inside(self, group: Path) -> Iterator[None]:
        """This process in ``group`` for the block, then back in the jobs' group (nothing where unavailable)."""
        if not self.available:
            yield
            return
        self._move(group)
        try:
            yield
        finally:
            self._move(self._jobs)

    @staticmethod
    def _move(group: Path) -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    def throttled_s(self) -> tuple[float, float]:
        """Seconds (node's, jobs') the kernel held each group back at its quota so far (cpu.stat's
        ``throttled_time``); (0, 0) where nothing is split. A job held back waits for its batch
        though the node has it: time a job on its own GPU node would not lose."""
        if not self.available:
            return 0.0, 0.0
        return _throttled(self._node), _throttled(self._jobs)

    def close(self) -> None:
        """Back to this process's own cgroup; the groups go once their processes have ended."""
        with contextlib.suppress(OSError):
            self._move(self._home)
        for group in (self._node, self._jobs):
            with contextlib.suppress(OSError):
                group.rmdir()


def _own_group() -> Path:
    """This process's cgroup in the cpu hierarchy (``/proc/self/cgroup``), under ``ROOT``."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpu" in controllers.split(","):
                return ROOT / path.lstrip("/")
    except (OSError, ValueError):
        pass
    return ROOT


def _throttled(group: Path) -> float:
    try:
        for line in (group / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "throttled_time":
                return int(value) / 1e9
    except (OSError, ValueError):
        pass
    return 0.0
