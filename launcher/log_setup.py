"""Logging set-up for every process of the product: each line says role, host and (trainers) rank.

In a job the host is the SageMaker host name (``algo-2``), not the machine's, so the lines of
``hetero local``'s emulated nodes on one machine stay apart; a ``hetero`` command names the
machine it runs on.
"""
from __future__ import annotations

import logging
import socket


def setup(role: str, host: str, rank: int | None = None, level: str = "INFO") -> None:
    """Configure the root logger for this process (replaces earlier handlers)."""
    who = f"{role}@{host}" + (f" rank {rank}" if rank is not None else "")
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO),
                        format=f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s", force=True)
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("torch").setLevel(logging.WARNING)  # its INFO lines at exit (FakeTensor cache stats) say nothing of the job


def setup_logging(role: str, level: str = "INFO") -> None:
    """Logging for a ``hetero`` command on this machine: lines say the command's role and the host."""
    setup(role, socket.gethostname(), level=level)
