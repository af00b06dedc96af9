#!/usr/bin/env bash
# Install everything from the project's own files, check generated code, run the tests.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/python scripts/gen_proto.py --check
exec .venv/bin/python -m pytest -q "$@"
