#!/usr/bin/env bash
# Install everything from the project's own files, check generated code, run the tests (the default
# tier, in two processes: pytest-xdist).
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/python scripts/gen_proto.py --check
exec .venv/bin/python -m pytest -q -n 2 "$@"
