#!/usr/bin/env bash
# Build the data-node and DNN-node images (docker/Dockerfile.data, docker/Dockerfile.dnn).
# Usage: bash scripts/build-images.sh [data] [dnn]       (default: both)
#
#   ENGINE          podman or docker (default: podman if present, else docker)
#   BASE_IMAGE      base of both images (default: localhost/hetero-base:py3, a local Python 3.11
#                   image; set BASE_IMAGE= to use each Dockerfile's own default: python:3.11-slim
#                   and a CUDA PyTorch image)
#   MAKE_BASE_IMAGE command that builds localhost/hetero-base:py3, run when that image is absent
#   TORCH_INDEX_URL where torch comes from (default: empty = the package index's CUDA build, for
#                   build hosts that cannot reach the PyTorch CPU index; set
#                   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for a slim data image)
#   PIP_CERT        CA bundle pip uses inside the build (default: /etc/ssl/certs/ca-certificates.crt
#                   when BASE_IMAGE is the local base image)
#   DATA_IMAGE, DNN_IMAGE  tags (default localhost/hetero-data:latest, localhost/hetero-dnn:latest)
# Each image gets the label hetero.deps=<hash of requirements/torch.txt, pyproject.toml and
# docker/install-deps.sh>; tests/test_containers.py skips when the label does not match the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
LOCAL_BASE=localhost/hetero-base:py3
BASE_IMAGE=${BASE_IMAGE-$LOCAL_BASE}
TORCH_INDEX_URL=${TORCH_INDEX_URL-}
DATA_IMAGE=${DATA_IMAGE:-localhost/hetero-data:latest}
DNN_IMAGE=${DNN_IMAGE:-localhost/hetero-dnn:latest}
if [ "$BASE_IMAGE" = "$LOCAL_BASE" ]; then
  PIP_CERT=${PIP_CERT-/etc/ssl/certs/ca-certificates.crt}
  if ! $ENGINE image exists "$LOCAL_BASE" 2>/dev/null; then
    [ -n "${MAKE_BASE_IMAGE:-}" ] || { echo "build-images: $LOCAL_BASE is missing; set MAKE_BASE_IMAGE to a command that builds it, or BASE_IMAGE= for the public bases" >&2; exit 2; }
    $MAKE_BASE_IMAGE
  fi
fi
deps_hash=$(cat requirements/torch.txt pyproject.toml docker/install-deps.sh | sha256sum | cut -c1-16)
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(data dnn)
for kind in "${targets[@]}"; do
  case $kind in data) tag=$DATA_IMAGE ;; dnn) tag=$DNN_IMAGE ;; *) echo "unknown image '$kind' (data, dnn)" >&2; exit 2 ;; esac
  args=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL" --build-arg "PIP_CERT=${PIP_CERT:-}" --label "hetero.deps=$deps_hash")
  [ -z "$BASE_IMAGE" ] || args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
  [ "$ENGINE" != podman ] || args+=(--network host)
  start=$(date +%s)
  echo "build-images: $ENGINE build -f docker/Dockerfile.$kind -t $tag ${args[*]} ."
  $ENGINE build -f "docker/Dockerfile.$kind" -t "$tag" "${args[@]}" .
  echo "build-images: $tag built in $(( $(date +%s) - start )) s; $($ENGINE image inspect "$tag" --format '{{.Size}}' | awk '{printf "%.2f GB", $1/1e9}')"
done
