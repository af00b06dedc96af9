"""The test kit's documented example (docs/testing.md) runs as written and proves what it says."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def doc_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "testing.md").read_text(), re.S)


@pytest.mark.slow
def test_the_documented_kill_and_cut_example_loses_and_duplicates_nothing():
    example = next(code for code in doc_examples() if "a.kill()" in code)
    out = subprocess.run([sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    counts = ast.literal_eval(out.stdout.strip().splitlines()[-1])  # the example prints check_audit's dict
    assert counts["delivered"] == 2 * 16 and counts["lost"] == counts["duplicated"] == counts["corrupt"] == 0
