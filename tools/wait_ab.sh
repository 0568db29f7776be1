#!/usr/bin/env bash
# The CUDA waits on the lent GPU machine: the tests of the wait modes, then where a run's time goes
# (tools/cuda_run_phases.py) and the CUDA tables, with the waiter thread polling (AIOMNN_CUDA_WAIT=thread)
# against the event loop polling the last stretch (loop, the default), in turns. Through the device tool:
#     run(command="bash tools/wait_ab.sh", carry=[".cache/lc", ".models"], timeout_s=600)
# CASES: model:shape:precision for the phases (cupy in, outputs on the device); MODELS, BATCHES the tables'.
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
export AIOMNN_MODELS=$PWD/.models
timeout 150 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -x \
  -k "wait_modes or waiter or fp16_inputs or device_inputs or device_outputs" 2>&1 | tail -2
for case in ${CASES:-yolov8n:1x3x320x320:low yolov8n:8x3x320x320:low yolov8n:8x3x320x320:normal}; do
  IFS=: read -r model shape precision <<< "$case"
  for mode in thread loop; do
    echo "== $case $mode"
    AIOMNN_CUDA_WAIT=$mode timeout 100 python3 tools/cuda_run_phases.py --model "$model" --shapes "$shape" \
      --precision "$precision" --device --tuning normal --runs 60 2>&1 | tail -1
  done
done
for round in 1 2; do
  for mode in thread loop; do
    echo "== tables, round $round, $mode"
    AIOMNN_CUDA_WAIT=$mode timeout 200 python3 benchmarks/gpu.py --models "${MODELS:-yolov8n,rec}" \
      --batches "${BATCHES:-1,8}" --backends cuda --precisions fp32,fp16 --n "${N:-15}" --no-torch --skip-extra \
      2>&1 | grep "^| [a-z]" | head -8
  done
done
