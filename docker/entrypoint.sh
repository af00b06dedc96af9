#!/bin/sh
# Entry point of both images. SageMaker runs a training image as `docker run IMAGE train`;
# the job's description comes from /opt/ml/input/config (resourceconfig.json,
# hyperparameters.json), so `train` (or no argument, or --key value hyperparameters) starts
# the launcher, which picks this node's role from its instance group. Any other command runs
# as is (`docker run IMAGE hetero --help`, `docker run IMAGE bash`).
#
# For local runs only (docker-compose.yml): when HETERO_SYNTH_TRAIN is set and the training
# channel holds no MNIST files, synthetic MNIST is written there first (as by `hetero synth`:
# HETERO_SYNTH_TRAIN training images, HETERO_SYNTH_TEST test images, seed 0: every node gets
# the same files). SageMaker never sets it.
set -eu
if [ "${1:-}" = train ]; then shift; fi
case "${1:-}" in
  ""|--*) ;;
  serve) echo "entrypoint: this image trains; it has no inference server ('serve')" >&2; exit 2 ;;
  *) exec "$@" ;;
esac
if [ -n "${HETERO_SYNTH_TRAIN:-}" ]; then
  channel="${SM_CHANNEL_TRAINING:-/opt/ml/input/data/training}"
  if [ ! -e "$channel/train-images-idx3-ubyte" ] && [ ! -e "$channel/train-images-idx3-ubyte.gz" ]; then
    echo "entrypoint: writing synthetic MNIST ($HETERO_SYNTH_TRAIN train, ${HETERO_SYNTH_TEST:-0} test images) to $channel"
    python -c 'import sys; from hetero.synthetic.mnist import write_synthetic; write_synthetic(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))' \
      "$channel" "$HETERO_SYNTH_TRAIN" "${HETERO_SYNTH_TEST:-0}"
  fi
fi
exec python /opt/ml/code/launcher/entry.py "$@"
