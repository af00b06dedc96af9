"""A data server's processes as a benchmark sees them: its main process, its warm parent (if
any) and its workers, with each one's private (USS) and proportional (PSS) memory.

Only the standard library and psutil: it reads a server started from any checkout.
"""
from __future__ import annotations

from dataclasses import dataclass

MB = 1 << 20
WARM_PARENT = "hetero-warm"  # the warm parent's process name (data_service/pool/warm_parent.py)
SPARE = "hetero-spare"       # a spare worker's, while it waits (data_service/pool/spare.py)


@dataclass(frozen=True)
class NodeTree:
    """The pids of one data server's processes."""

    main: int
    parent: int | None  # the warm parent; None when the workers are spawned
    workers: tuple[int, ...]
    spare: int | None = None  # a loaded worker waiting to replace one


def node_tree(server_pid: int) -> NodeTree:
    """The server's warm parent and workers: the warm parent's children, or (spawned) the
    server's multiprocessing children."""
    import psutil

    parent, workers, spare = None, [], None
    for child in psutil.Process(server_pid).children():
        try:
            name, cmd = child.name(), " ".join(child.cmdline())
            if name == WARM_PARENT:
                parent = child.pid
                for w in child.children():
                    if w.name() == SPARE:
                        spare = w.pid
                    else:
                        workers.append(w.pid)
            elif "multiprocessing" in cmd and "resource_tracker" not in cmd:
                workers.append(child.pid)
        except psutil.Error:
            continue  # ended meanwhile
    return NodeTree(server_pid, parent, tuple(workers), spare)


SLOT = "memfd:hetero-slot"  # a worker's output slots (data_service/pool/process.py)


def memory(pid: int) -> tuple[float, float]:
    """(USS, PSS) of ``pid`` in MB; (0, 0) once it is gone."""
    import psutil

    try:
        info = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return 0.0, 0.0
    return info.uss / MB, info.pss / MB


def slots(pid: int) -> tuple[float, float]:
    """(resident, private) MB of worker ``pid``'s output slots: memory it adds to the node whether
    or not the server or a consumer maps it too (then it is not in the worker's USS)."""
    rss = private = 0
    in_slot = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if not head.endswith(":") or "-" in head:  # a mapping's first line
                    in_slot = SLOT in line
                elif in_slot and head == "Rss:":
                    rss += int(line.split()[1])
                elif in_slot and head in ("Private_Clean:", "Private_Dirty:"):
                    private += int(line.split()[1])
    except OSError:
        return 0.0, 0.0
    return rss / 1024, private / 1024


def own(pid: int) -> float:
    """What worker ``pid`` adds to the node, in MB: its private pages, and its output slots whole."""
    uss, _ = memory(pid)
    rss, private = slots(pid)
    return uss - private + rss


def tree_memory(tree: NodeTree) -> dict:
    """Each worker's USS, its own memory (``own``: its USS, and its slots whole) and its slots, the
    warm parent's, the spare's and the main process's USS, and the PSS of them all (what the node
    pays for the server: shared pages counted once), in MB."""
    workers = [memory(p) for p in tree.workers]
    parent = memory(tree.parent) if tree.parent else (0.0, 0.0)
    spare = memory(tree.spare) if tree.spare else (0.0, 0.0)
    main = memory(tree.main)
    return {"worker_uss_mb": [round(u, 1) for u, _ in workers],
            "worker_own_mb": [round(own(p), 1) for p in tree.workers],
            "worker_slots_mb": [round(slots(p)[0], 1) for p in tree.workers], "parent_uss_mb": round(parent[0], 1),
            "spare_uss_mb": round(spare[0], 1), "main_uss_mb": round(main[0], 1),
            "all_pss_mb": round(main[1] + parent[1] + spare[1] + sum(p for _, p in workers), 1)}
