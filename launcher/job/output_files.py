"""What a node leaves in its output folders: JSON files written whole (``metrics.json``,
``data_node.json``), and the failure file whose text SageMaker shows as the job's FailureReason.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any

FAILURE_TEXT_MAX = 1000  # characters of one message kept in the failure file


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write atomically (temp file + rename)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def write_failure(path: str, message: str) -> None:
    """Add ``message`` to the failure file at ``path``; a file that cannot be written is passed over
    (the message is in the log already)."""
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write(message[:FAILURE_TEXT_MAX] + "\n")
