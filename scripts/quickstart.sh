#!/usr/bin/env bash
# Quickstart: install, then run the main job twice on synthetic MNIST on this machine and
# print both average step times:
#   heterogeneous: 1 emulated GPU node (CPU 0) + 1 data node (the other CPUs); the GPU node
#                  also serves batches from its own CPU (dnn_local_server=true)
#   homogeneous:   the same GPU node alone, preprocessing in its own DataLoader workers
# The accelerator step is EMULATED (a 50 ms sleep: no GPU here), so step time shows how well
# each layout feeds a fast accelerator. Real-model runs: drop --hp emulate_step_s.
# Usage: bash scripts/quickstart.sh [extra `hetero local` args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev

cpus=$(.venv/bin/python -c "import os; print(len(os.sched_getaffinity(0)))")
pin_dnn=(); pin_data=()
if [ "$cpus" -ge 2 ]; then
  pin_dnn=(--dnn-cpus 0); pin_data=(--data-cpus "1-$((cpus - 1))")
fi
common=(--synth-train 8192 --synth-test 1000 --seed 0 --quiet "${pin_dnn[@]}"
        --hp emulate_step_s=0.05 --hp pipeline.batch_size=64 --hp pipeline.augment_repeats=4
        --hp loader_workers=1 --hp log_every=40 "$@")
out=out/quickstart
echo "== heterogeneous (1 data node + 1 emulated GPU node) =="
.venv/bin/hetero local --data-nodes 1 --dnn-nodes 1 "${pin_data[@]}" --hp dnn_local_server=true \
  --output "$out/hetero" "${common[@]}"
echo "== homogeneous (the emulated GPU node alone) =="
.venv/bin/hetero local --homogeneous --dnn-nodes 1 --output "$out/homo" "${common[@]}"

.venv/bin/python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
hetero, homo = (json.load(open(f"{out}/{m}/metrics.json")) for m in ("hetero", "homo"))
print()
for m in (hetero, homo):
    print(f"{m['mode']:>13}: avg step time {m['avg_step_time_s']:.4f} s/step "
          f"({m['step_kind']} {m['emulate_step_s'] or ''} s step; data wait {m['data_wait_fraction']:.0%}; "
          f"{m['samples_per_s']:.0f} samples/s; {m['warmup_steps_discarded']} warm-up steps discarded)")
print(f"      speed-up: {homo['avg_step_time_s'] / hetero['avg_step_time_s']:.2f}x (metrics in {out}/*/metrics.json)")
PY
