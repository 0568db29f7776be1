#!/usr/bin/env bash
# One backend's steps against CUDA's on the lent GPU machine: tools/gpu_profiles.sh profiles each model on BACKEND
# (default opencl) and on CUDA, and tools/trace_compare.py lists the steps where CUDA gains the most. Through the
# device tool:
#     run(command="MODELS='yolov8n:images=8x3x320x320 rec:x=8x3x48x320' bash tools/steps_vs_cuda.sh",
#         carry=[".cache/lc", ".models"])
# PRECISION (default normal: fp32) and TOP (default 20) apply to all.
set -u
backend=${BACKEND:-opencl} precision=${PRECISION:-normal}
cases=""
for m in ${MODELS:?}; do cases+=" $m:$backend:$precision $m:cuda:$precision"; done
CASES="$cases" TOP=8 bash tools/gpu_profiles.sh
for m in $MODELS; do
  model=${m%%:*} shape=${m#*=}
  echo "== $model $shape: $backend (A) against cuda (B), $precision"
  python3 tools/trace_compare.py "$OUT/${model}_${shape}_${backend}_${precision}.json" \
    "$OUT/${model}_${shape}_cuda_${precision}.json" --top "${TOP:-20}"
done
