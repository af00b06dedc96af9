#!/usr/bin/env bash
# The GPU checks, on a CUDA machine with PyTorch, torchvision, grpcio, protobuf and Pillow installed
# and no package registry: build the fused decoder, run the gpu-marked tests, run benchmarks.gpu's
# sweep. Everything it writes goes to $OUT (default out/gpu): env.txt, build.txt, gpu-tests.txt,
# gpu-bench.txt, gpu.json.
#
#   bash benchmarks/gpu_check.sh                       # K=4,8,12 STEPS=100 WARMUP=20
#   K=2,4,8 STEPS=60 bash benchmarks/gpu_check.sh
#   SKIP_BENCH=1 bash benchmarks/gpu_check.sh          # packages, build and the gpu tests only
#   SKIP_TESTS=1 bash benchmarks/gpu_check.sh          # packages, build and the benchmark only
#   K=1 STEPS=2 WARMUP=1 BENCH_ARGS="--device cpu --image-size 32 --images 16 --batch-size 4" \
#       bash benchmarks/gpu_check.sh                   # the whole script on a machine without a GPU
#   bash benchmarks/gpu_check.sh --prepare             # where a registry is: fill .whl/gpu-box (below)
#
# What the project needs beyond those five packages travels in .whl/gpu-box (git-ignored: carry it
# with the tree; about 2 MB), made by --prepare: the pure-Python wheels of grpcio-health-checking
# (the data server's health service), pytest and its dependencies, tqdm; and libjpeg-turbo's four
# public headers. Missing ones are installed from there with `pip install --no-index --no-deps`.
# The fused decoder builds with setup.py against the system's libjpeg-turbo where its headers are
# installed, else against the carried headers and the libjpeg-turbo that Pillow's wheel bundles
# (same jpeg62 ABI). Where neither builds, the benchmark says it ran the fallback decoder.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python || command -v python3)}
WHEELS=${WHEELS:-.whl/gpu-box}
OUT=${OUT:-out/gpu}
K=${K:-4,8,12}
STEPS=${STEPS:-100}
WARMUP=${WARMUP:-20}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "${1:-}" = "--prepare" ]; then
    mkdir -p "$WHEELS/jpeg-include"
    "$PY" -m pip download --no-deps -d "$WHEELS" "grpcio-health-checking==1.80.1" "pytest==9.2.0" "pluggy==1.7.0" \
        "iniconfig==2.3.1" "packaging==26.4" "pygments==2.21.0" "pytest-timeout==2.4.0" "tqdm==4.70.1" || exit 1
    for h in jpeglib.h jmorecfg.h jerror.h; do cp "/usr/include/$h" "$WHEELS/jpeg-include/" || exit 1; done
    cp /usr/include/*/jconfig.h "$WHEELS/jpeg-include/" 2>/dev/null || cp /usr/include/jconfig.h "$WHEELS/jpeg-include/" || exit 1
    du -sh "$WHEELS"
    exit 0
fi

mkdir -p "$OUT"
step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

step "environment" | tee "$OUT/env.txt"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: not found"
    echo "cores: $(nproc)"
    "$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "torchvision", "grpc", "google.protobuf", "PIL", "numpy"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:
        print(name, "MISSING:", exc)
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
} 2>&1 | tee -a "$OUT/env.txt"

step "packages the tree carries" | tee -a "$OUT/env.txt"
for pair in grpc_health:grpcio_health_checking pytest:pytest pluggy:pluggy iniconfig:iniconfig packaging:packaging \
            pygments:pygments pytest_timeout:pytest_timeout tqdm:tqdm; do
    module=${pair%%:*} wheel=${pair##*:}
    if "$PY" -c "import $module" 2>/dev/null; then
        echo "$module: installed"
    elif ls "$WHEELS"/"$wheel"-*.whl >/dev/null 2>&1; then
        if "$PY" -m pip --version >/dev/null 2>&1; then
            "$PY" -m pip install -q --no-index --no-deps "$WHEELS"/"$wheel"-*.whl && echo "$module: installed from $WHEELS"
        else  # no pip: unpack into the tree's root, on every process's path (servers run from the root)
            "$PY" -m zipfile -e "$WHEELS"/"$wheel"-*.whl . && echo "$module: unpacked from $WHEELS into $PWD"
        fi
    else
        echo "$module: MISSING and no wheel in $WHEELS (run bash benchmarks/gpu_check.sh --prepare where a registry is)"
    fi
done 2>&1 | tee -a "$OUT/env.txt"

step "the fused decoder's C extension" | tee "$OUT/build.txt"
{
    "$PY" setup.py -q build_ext --inplace 2>&1 | tail -5
    if ! "$PY" -c "from data_service.pipelines import _jpegcrop" 2>/dev/null; then
        echo "setup.py did not build it (no libjpeg headers or setuptools?); trying the carried headers and Pillow's libjpeg-turbo"
        PIL_LIBS=$("$PY" -c "import PIL, pathlib; print(pathlib.Path(PIL.__file__).resolve().parent.parent / 'pillow.libs')")
        LIB=$(ls "$PIL_LIBS"/libjpeg-*.so.62* 2>/dev/null | head -1)
        EXT=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
        INC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
        if [ -n "$LIB" ] && [ -f "$INC/Python.h" ] && [ -f "$WHEELS/jpeg-include/jpeglib.h" ]; then
            ${CC:-cc} -O2 -shared -fPIC -I"$INC" -I"$WHEELS/jpeg-include" data_service/pipelines/_jpegcrop.c "$LIB" \
                -Wl,-rpath,"$PIL_LIBS" -o "data_service/pipelines/_jpegcrop$EXT" 2>&1 | tail -5
        else
            echo "cannot: libjpeg of Pillow '${LIB:-none}', Python.h in '$INC', headers in $WHEELS/jpeg-include"
        fi
    fi
    "$PY" -c "from data_service.pipelines import crop_decode; print('fused decoder built:', crop_decode.available())"
} 2>&1 | tee -a "$OUT/build.txt"

if [ -z "${SKIP_TESTS:-}" ]; then
    step "gpu-marked tests" | tee "$OUT/gpu-tests.txt"
    # only the files holding gpu tests: the others import what this machine need not have (moto, boto3, ...)
    timeout 900 "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider $(grep -l "mark.gpu" tests/test_*.py) 2>&1 \
        | tee -a "$OUT/gpu-tests.txt"
fi

if [ -z "${SKIP_BENCH:-}" ]; then
    step "benchmarks.gpu K=$K STEPS=$STEPS WARMUP=$WARMUP" | tee "$OUT/gpu-bench.txt"
    timeout 1800 "$PY" -m benchmarks.gpu --k "$K" --steps "$STEPS" --warmup "$WARMUP" --json "$OUT/gpu.json" \
        ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/gpu-bench.txt"
fi
step "done: $OUT"
