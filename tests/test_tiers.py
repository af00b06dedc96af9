"""tests/tiers.py names real tests: a renamed or removed test must leave the long tier too."""
from __future__ import annotations

from pathlib import Path

from tiers import LONG

HERE = Path(__file__).resolve().parent


def test_every_long_test_exists():
    missing = []
    for nodeid in sorted(LONG):
        path, _, name = nodeid.partition("::")
        source = (HERE / path).read_text() if (HERE / path).is_file() else ""
        if f"def {name.partition('[')[0]}(" not in source:
            missing.append(nodeid)
    assert not missing, f"tests/tiers.py names tests that do not exist: {missing}"
