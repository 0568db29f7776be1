#!/usr/bin/env bash
# The CUDA backend's tests and GPU benchmark on the lent GPU machine, through the device tool, carrying .cache/lc
# (the wheels the image lacks, see tools/lifecycle_on_gpu_machine.sh) and .models (the public models):
#   TESTS="tests/test_cuda.py" PYTEST_ARGS="-k device" BENCH="--backends cuda --models det,rec --batches 1,8" \
#     bash tools/cuda_on_gpu_machine.sh
# TESTS="" skips pytest; BENCH="" skips benchmarks/gpu.py. What they print also goes to $OUT.
set -u
export PYTHONUNBUFFERED=1 AIOMNN_MODELS="$PWD/.models" OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .cache/lc/whl/*.whl 2>/dev/null \
  && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -n "${TESTS-tests/test_cuda.py}" ]; then
  timeout "${TEST_SECONDS:-300}" python3 -m pytest -q -p no:cacheprovider ${TESTS-tests/test_cuda.py} ${PYTEST_ARGS:-} \
    2>&1 | tail -${TAIL:-30} | tee "$OUT/pytest.txt"
fi
if [ -n "${BENCH:-}" ]; then
  python3 benchmarks/gpu.py $BENCH --out "$OUT" 2>&1 | tee "$OUT/gpu.txt"
fi
