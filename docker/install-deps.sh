#!/bin/sh
# Installs the project's runtime dependencies into /opt/venv (run by both Dockerfiles, so the
# two images share this layer when built from the same base).
#   TORCH_INDEX_URL  empty: the torch pair of requirements/torch.txt from the package index
#                    (on Linux that is the CUDA build, ~5 GB with its nvidia-* wheels);
#                    set (e.g. https://download.pytorch.org/whl/cpu): the same versions from there.
#   PIP_CERT         a CA bundle for pip (a network with a TLS-intercepting proxy); empty: pip's own.
#   REINSTALL_TORCH  1: install the pinned pair even when the base image already has torch.
set -eu
[ -n "${PIP_CERT:-}" ] || unset PIP_CERT
PY=/opt/venv/bin/python
if ! command -v python3 >/dev/null 2>&1; then  # a bare CUDA base (Debian/Ubuntu)
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
  rm -rf /var/lib/apt/lists/*
fi
# A C compiler and libjpeg-turbo's headers: the image pipeline's fused crop-and-decode is a small C
# extension built in the image (Dockerfile: setup.py build_ext).
if command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    gcc libc6-dev libjpeg-dev python3-dev >/dev/null
  rm -rf /var/lib/apt/lists/*
elif command -v dnf >/dev/null 2>&1; then
  dnf install -y -q gcc libjpeg-turbo-devel python3-devel && dnf clean all
fi
# --system-site-packages: a PyTorch base image's own torch stays visible in the venv.
python3 -m venv --system-site-packages /opt/venv
$PY -m pip install -q --upgrade pip
if [ "${REINSTALL_TORCH:-0}" != 1 ] && $PY -c "import torch, torchvision" 2>/dev/null; then
  echo "install-deps: using the base image's torch $($PY -c 'import torch; print(torch.__version__)')"
elif [ -n "${TORCH_INDEX_URL:-}" ]; then
  # requirements/torch.txt pins exact versions; a local label (+cpu) still matches them.
  pair=$(sed -n 's/^\(torch\(vision\)\{0,1\}==[0-9.]*\).*/\1/p' /tmp/deps/requirements/torch.txt)
  $PY -m pip install -q --index-url "$TORCH_INDEX_URL" $pair
else
  $PY -m pip install -q -r /tmp/deps/requirements/torch.txt
fi
# The project's own runtime dependencies, read from pyproject.toml (the project itself is not
# installed: its code lives in /opt/ml/code, on PYTHONPATH, as SageMaker expects).
$PY - <<'PYEOF' > /tmp/deps/runtime.txt
import re, sys
try:
    import tomllib
    deps = tomllib.load(open("/tmp/deps/pyproject.toml", "rb"))["project"]["dependencies"]
except ImportError:  # Python 3.10
    text = open("/tmp/deps/pyproject.toml").read()
    block = re.search(r"^dependencies = \[(.*?)\]", text, re.S | re.M).group(1)
    deps = re.findall(r'"([^"]+)"', block)
print("\n".join(deps))
PYEOF
$PY -m pip install -q -r /tmp/deps/runtime.txt
$PY -c "import torch, torchvision, grpc, numpy; from torchvision.transforms import v2; v2.GaussianBlur(3)(torch.zeros(1, 4, 4)); print('install-deps: torch', torch.__version__, 'torchvision', torchvision.__version__, 'ok')"
