#!/usr/bin/env bash
# The CUDA backend's tests and GPU benchmark on the lent GPU machine, through the device tool, carrying .cache/lc
# (what tools/gpu_setup.sh installs) and .models (the public models):
#   TESTS="tests/test_cuda.py" PYTEST_ARGS="-k device" BENCH="--backends cuda --models det,rec --batches 1,8" \
#     bash tools/cuda_on_gpu_machine.sh
# TESTS="" skips pytest; BENCH="" skips benchmarks/gpu.py. What they print also goes to $OUT.
set -u
source tools/gpu_setup.sh
if [ -n "${TESTS-tests/test_cuda.py}" ]; then
  timeout "${TEST_SECONDS:-300}" python3 -m pytest -q -p no:cacheprovider ${TESTS-tests/test_cuda.py} ${PYTEST_ARGS:-} \
    2>&1 | tail -${TAIL:-30} | tee "$OUT/pytest.txt"
fi
if [ -n "${BENCH:-}" ]; then
  python3 benchmarks/gpu.py $BENCH --out "$OUT" 2>&1 | tee "$OUT/gpu.txt"
fi
