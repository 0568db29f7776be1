#!/usr/bin/env bash
# Half floats on the lent GPU machine: the tests of fp16 inputs (rounded on the host or cast on the device, on CUDA
# and Vulkan), of the cooperative-matrix kernels and of device inputs; then the CUDA and Vulkan tables in both
# precisions (numpy in and out), and a profile of YOLOv8n b1 on Vulkan fp16 summed by op type. Through the device
# tool:
#     run(command="bash tools/fp16_check.sh", carry=[".cache/lc", ".models"], timeout_s=600)
# STEPS picks and orders the parts (default "tests table profile"; also ab: CUDA fp16 with the inputs rounded on the
# host against AIOMNN_NUMBA=0, where numba is off and the device casts them, in turns, two rounds; whole models on the
# device, so nothing else of the run leans on numba); MODELS and BATCHES the tables' rows (default det,yolov8n,rec,cls
# and 1,8; ab: det,yolov8n,rec and 8); N the timed runs a case.
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
export AIOMNN_MODELS=$PWD/.models
for step in ${STEPS:-tests table profile}; do
  case "$step" in
    tests)
      timeout 200 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider \
        -k "fp16_inputs or device_inputs or device_outputs or inputs_of_any_layout or large_inputs" \
        > "$OUT/cuda_tests.txt" 2>&1 &
      timeout 200 python3 -m pytest tests/test_vulkan.py -q -p no:cacheprovider \
        -k "coop or fp16_inputs or straight" > "$OUT/vk_tests.txt" 2>&1 &
      wait  # on the two test runs' own PIDs
      for s in cuda_tests vk_tests; do
        echo "== $s: $(tail -1 "$OUT/$s.txt")"; grep -E "^(FAILED|ERROR)|Error" "$OUT/$s.txt" | head -8
      done ;;
    table)
      for b in ${BATCHES:-1 8}; do
        timeout 240 python3 benchmarks/gpu.py --models "${MODELS:-det,yolov8n,rec,cls}" --batches "$b" \
          --backends cuda,vulkan --precisions fp32,fp16 --n "${N:-15}" --no-torch --skip-extra \
          > "$OUT/table_b$b.md" 2>&1
        grep "^|" "$OUT/table_b$b.md" | head -24
      done ;;
    ab)
      for round in 1 2; do
        for numba in 0 background; do
          echo "== round $round, AIOMNN_NUMBA=$numba"
          AIOMNN_NUMBA=$numba timeout 200 python3 benchmarks/gpu.py --models "${MODELS:-det,yolov8n,rec}" \
            --batches "${BATCHES:-8}" --backends cuda --precisions fp16 --n "${N:-15}" --no-torch --skip-extra \
            2>&1 | grep "^| [a-z]" | head -4
        done
      done ;;
    profile)
      TOP=16 CASES='yolov8n:images=1x3x320x320:vulkan:low' timeout 150 bash tools/gpu_profiles.sh
      python3 - "$OUT/yolov8n_1x3x320x320_vulkan_low.json" <<'PY'
import json, statistics, sys
convs = {}
for e in json.load(open(sys.argv[1]))["traceEvents"]:
    if e.get("ph") == "X" and e["name"].endswith("Conv"):
        convs.setdefault(e["name"], []).append(e["dur"])
med = {k: statistics.median(v) for k, v in convs.items()}
print("convs, device us a run:", round(sum(med.values()), 1))
for k in sorted(med, key=lambda k: -med[k])[:12]:
    print(f"  {k[:50]:50s} {med[k]:6.1f}")
PY
      ;;
  esac
done
