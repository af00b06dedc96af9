"""What must not cross a fork, and how a process tells whether it holds any.

A forked child gets one thread, the caller's, and a copy of everything else: locks another
thread held stay held for good; grpc's core (its threads, its pollers, its sockets) is copied
half-way; a socket is shared with the parent, so two processes read one stream. The warm parent
(warm_parent.py) forks data workers only while it holds none of these, and checks again after
each module it imports, so that a refusal names the module that brought the hazard in. A data
worker reports the same of itself once it built its pipeline (process.py): what it imported can
be imported by the warm parent as well only if it holds nothing unsafe either.

Only the standard library here: the warm parent imports this before anything else.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass


def threads(but_mine: bool = False) -> list[str]:
    """The names of this process's threads (the kernel's view: native ones count too); with
    ``but_mine``, of those besides the calling thread."""
    names, mine = [], str(threading.get_native_id())
    for tid in os.listdir("/proc/self/task"):
        if but_mine and tid == mine:
            continue
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:  # OSError: ended meanwhile
            names.append(f.read().strip())
    return names


def sockets() -> int:
    """How many socket descriptors this process holds open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed meanwhile
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


@dataclass(frozen=True)
class Hazards:
    """What a fork of this process would copy half-way: nothing when ``clean``."""

    threads: tuple[str, ...] = ()  # names of the threads besides the caller's
    grpc: bool = False             # the gRPC runtime is loaded
    sockets: int = 0               # sockets besides the ones the process is meant to hold

    @property
    def clean(self) -> bool:
        return not self.threads and not self.grpc and not self.sockets

    def __str__(self) -> str:
        said = []
        if self.threads:
            said.append(f"left {len(self.threads)} thread(s) running ({', '.join(self.threads)}); a fork copies "
                        "only one, with whatever locks the others held")
        if self.grpc:
            said.append("loaded grpc, whose threads and sockets a fork would copy half-way")
        if self.sockets:
            said.append(f"left {self.sockets} socket(s) open, which a forked worker would share")
        return "; ".join(said) or "nothing unsafe"


def hazards(own_sockets: int) -> Hazards:
    """What this process holds that must not cross a fork; ``own_sockets``: the sockets it is
    meant to hold (the warm parent's control socket, a worker's pipe to the server)."""
    return Hazards(tuple(threads(but_mine=True)), "grpc" in sys.modules, max(0, sockets() - own_sockets))
