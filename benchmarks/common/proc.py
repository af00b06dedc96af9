"""CPU time and context switches of processes, read from /proc (Linux)."""
from __future__ import annotations

import os


def usage(pids: list[int]) -> tuple[float, int, int]:
    """CPU seconds (utime + stime) of these processes so far, and the voluntary and involuntary
    context switches of their live threads; a process that is gone counts 0."""
    tick, cpu, vol, invol = os.sysconf("SC_CLK_TCK"), 0.0, 0, 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        cpu += (int(fields[11]) + int(fields[12])) / tick
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches"):
                            vol += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches"):
                            invol += int(line.split()[1])
            except OSError:
                pass  # the thread ended
    return cpu, vol, invol


def cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid`` alone so far (0 once it is gone)."""
    return usage([pid])[0]


def descendants(pid: int) -> list[int]:
    """The live processes below ``pid`` (children, their children, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` and every live process below it: a data server with its
    workers, a loader with its worker processes."""
    return usage([pid, *descendants(pid)])[0]
