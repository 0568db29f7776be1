#!/usr/bin/env bash
# Issue 27's round on the lent GPU machine: the three GPU backends timed on the public models (minilm from random
# weights of its shapes, tools/stand_in_models.py), then their tests on the real GPU. Through the device tool:
#     run(command="bash tools/gpu_round.sh", carry=[".cache/lc", ".models"], timeout_s=600)
# STEPS picks and orders the parts (default "bench minilm tests"); N the timed runs a case.
set -u
source tools/gpu_setup.sh
python3 tools/stand_in_models.py .models >/dev/null
N="${N:-30}"
for step in ${STEPS:-bench minilm tests}; do
  case "$step" in
    bench) python3 benchmarks/gpu.py --models det,rec,cls,yolov8n --backends cuda,opencl,vulkan --precisions fp32 \
             --n "$N" --no-torch --skip-extra 2>&1 | tee "$OUT/bench.md" | grep -v "^\s*$" | tail -40 ;;
    fp16) python3 benchmarks/gpu.py --models det,rec,cls,yolov8n --backends cuda,opencl,vulkan --precisions fp16 \
             --n "$N" --no-torch --skip-extra 2>&1 | tee "$OUT/fp16.md" | tail -30 ;;
    minilm) python3 benchmarks/gpu.py --models minilm --tokens 128 --batches 1,8 --backends cuda,vulkan,opencl \
             --precisions fp32 --n 20 --skip-extra "${TORCH:---no-torch}" 2>&1 | tee "$OUT/minilm.md" | tail -20 ;;
    alternating) python3 benchmarks/alternating.py --backends opencl,vulkan,cuda --runs 20 --tuning none 2>&1 | tail -12 ;;
    tests) python3 -m pytest tests/test_opencl.py tests/test_vulkan.py -q -x -p no:cacheprovider 2>&1 | tail -8 ;;
  esac
done
