#!/usr/bin/env bash
# The event loop's looks (aiomnn.fence.Looks) on the lent GPU machine: the CUDA and Vulkan tests of the waits,
# then benchmarks/gpu.py from the tree before (unpacked into _before: git archive REV | tar -x -C _before) and
# this one, in turns (tools/ab_trees.sh). Through the device tool:
#     run(command="bash tools/looks_check.sh", carry=[".cache/lc", ".models"], timeout_s=400)
# MODELS, BATCHES and ROUNDS pick the tables (default yolov8n,rec; 1,8; 1).
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
export AIOMNN_MODELS=$PWD/.models
timeout 120 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider \
  -k "wait_modes or waiter or fp16_inputs or device_inputs or device_outputs" > "$OUT/cuda_tests.txt" 2>&1 &
timeout 120 python3 -m pytest tests/test_vulkan.py -q -p no:cacheprovider \
  -k "event_loop_completes or staged_and_fence or handed_over" > "$OUT/vk_tests.txt" 2>&1 &
wait  # on the two test runs
for s in cuda_tests vk_tests; do
  echo "== $s: $(tail -1 "$OUT/$s.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/$s.txt" | head -8
done
[ -d _before ] && ROUNDS=${ROUNDS:-1} BENCH=benchmarks/gpu.py ARGS="--models ${MODELS:-yolov8n,rec} \
  --batches ${BATCHES:-1,8} --backends cuda,vulkan --precisions fp32,fp16 --n 15 --no-torch --skip-extra" \
  timeout 300 bash tools/ab_trees.sh
