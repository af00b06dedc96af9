"""Logging set-up for launcher processes: every line says role, host and (trainers) rank.

The host is the SageMaker host name (``algo-2``), not the machine's, so the lines of
``hetero local``'s emulated nodes on one machine stay apart.
"""
from __future__ import annotations

import logging


def setup(role: str, host: str, rank: int | None = None, level: str = "INFO") -> None:
    """Configure the root logger for this process (replaces earlier handlers)."""
    who = f"{role}@{host}" + (f" rank {rank}" if rank is not None else "")
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO),
                        format=f"%(asctime)s {who} %(levelname)s %(name)s: %(message)s", force=True)
