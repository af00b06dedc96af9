"""A pipeline module that imports everywhere except in a pool's warm parent (it needs a process of its own)."""
from __future__ import annotations

import inspect

if any(f.filename.endswith("pool/warm_parent.py") and f.function == "main" for f in inspect.stack(0)):
    raise ImportError("this pipeline sets up a device context that a forked child cannot share")

from examples.synthetic import build_pipeline  # noqa: E402,F401
