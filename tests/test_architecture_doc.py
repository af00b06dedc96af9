"""docs/architecture.md lists every module of the product, and nothing that is not there."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("data_service", "dnn_worker", "launcher", "hetero")


def test_the_module_tables_match_the_tree():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `((?:%s)/[\w/]+\.py)` \|" % "|".join(PACKAGES), doc, re.M))
    tree = {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py") and "generated" not in p.parts}
    assert not tree - listed, f"modules missing from docs/architecture.md's Modules tables: {sorted(tree - listed)}"
    assert not listed - tree, f"docs/architecture.md lists modules that do not exist: {sorted(listed - tree)}"
