#!/usr/bin/env bash
# Create .venv and install the project with its extras (idempotent). pip's output goes to
# .venv/install.log; on a failure the end of that log is printed and the script exits non-zero.
# Usage: bash scripts/setup.sh [extras]   (default extras: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
log=.venv/install.log
echo "installing into .venv (log: $log)"
: >"$log"
# --no-compile: pip compiles every installed module in one process (about 2 of the 5 minutes a fresh
# venv takes on 2 cores); compileall below does it on every core.
pip_install() {
  if ! .venv/bin/python -m pip install --disable-pip-version-check --no-compile "$@" >>"$log" 2>&1; then
    echo "setup: pip install $* failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}
pip_install --upgrade pip
# The torch pair first, from its own pin file (see the comment there).
pip_install -r requirements/torch.txt
pip_install -e ".[${extras}]"
# smdebug-rulesconfig (a SageMaker SDK dependency, in the dev and sagemaker extras) installs its own test
# suite as a top-level `tests` package, which shadows this repository's tests/ for imports such as
# tests.test_pipeline: remove that copy.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if grep -qs '^tests/__init__.py,' "$site"/smdebug_rulesconfig-*.dist-info/RECORD; then rm -rf "$site/tests"; fi
.venv/bin/python -m compileall -q -j 0 "$site" >>"$log" 2>&1 || true  # a module that does not compile is pip's to report
.venv/bin/python -c "import torch, torchvision; from torchvision.transforms import v2; v2.GaussianBlur(3)(torch.zeros(1, 4, 4)); print(f'torch {torch.__version__}, torchvision {torchvision.__version__}: ok')"
