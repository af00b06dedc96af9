#!/usr/bin/env bash
# Install everything from the project's own files, check generated code and types, run the tests (the default
# tier, in two processes: pytest-xdist).
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/python scripts/gen_proto.py --check
# the type checker over the product packages ([tool.mypy] in pyproject.toml): 0 errors, or the run stops
start=$(date +%s)
.venv/bin/python -m mypy
echo "mypy: $(( $(date +%s) - start )) s"
exec .venv/bin/python -m pytest -q -n 2 "$@"
