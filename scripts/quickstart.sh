#!/usr/bin/env bash
# Quickstart: install, then train on a JPEG image folder twice on this machine and show what a
# data node buys: decode + RandomResizedCrop(224) + flip, the accelerator step EMULATED (no GPU
# here) at a third of one core's preprocessing time per batch, so the node's own CPU starves it.
#   homogeneous:   one node on CPU 0, preprocessing in its own loader worker
#   heterogeneous: the same node on CPU 0 (also serving batches from its core) + a data node
#                  on the other CPUs
# Prints the profile and the step it chose, both step times, data wait, the speed-up and the
# planner's prediction; writes out/quickstart/quickstart.png. See docs/images.md.
# Usage: bash scripts/quickstart.sh [--steps 80] [--batch-size 32] [--output DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/python scripts/quickstart.py "$@"
