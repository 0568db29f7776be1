#!/usr/bin/env bash
# Issue 27's round on the lent GPU machine: the three GPU backends timed on the public models (minilm from random
# weights of its shapes, tools/stand_in_models.py), then their tests on the real GPU. Through the device tool:
#     run(command="bash tools/gpu_round.sh", carry=[".cache/lc", ".models"], timeout_s=600)
# STEPS picks and orders the parts (default "bench minilm tests"; also fp16, alternating, profile: the ten costliest
# ops of det b8, cls b1 and rec b1 on BACKEND, default opencl); N the timed runs a case.
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
    profile) for m in "ch_PP-OCRv4_det_infer x=8x3x640x640" "ch_ppocr_mobile_v2.0_cls_infer x=1x3x48x192" \
                      "ch_PP-OCRv4_rec_infer x=1x3x48x320"; do
               set -- $m
               python3 -m aiomnn.cli run ".models/$1.onnx" --backend "${BACKEND:-opencl}" --shape "$2" --requests 30 \
                 --concurrency 1 --tuning none --profile "$OUT/$1.json" 2>&1 | tail -14
             done ;;
    tests) python3 -m pytest tests/test_opencl.py tests/test_vulkan.py -q -x -p no:cacheprovider 2>&1 | tail -8 ;;
  esac
done
