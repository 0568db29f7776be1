#!/usr/bin/env bash
# Replay chains (backend.CHAINS) on and off in turns on the lent GPU machine's CPU, then the 16-thread table; run
# through the device tool after `bash tools/device_carry.sh` here, carrying .cache/lc and .models:
#   MODELS="cls:1x3x48x192 yolov8n:1x3x320x320 rec:1x3x48x320 minilm:1x16" THREADS="1 16" \
#     bash tools/chains_on_gpu_machine.sh
set -uo pipefail
source tools/gpu_setup.sh >/dev/null 2>&1
export AIOMNN_MODELS="$PWD/.models" PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
python3 tools/stand_in_models.py .models >/dev/null
for t in ${THREADS:-1 16}; do
  for m in ${MODELS:-cls:1x3x48x192 yolov8n:1x3x320x320 rec:1x3x48x320 minilm:1x16}; do
    python3 tools/ab_cpu.py "${m%%:*}" "${m#*:}" "$t" aiomnn.backends.cpu.backend.CHAINS 1,0 2>&1 | tail -2
  done
done
[ -n "${TABLE:-}" ] && python3 benchmarks/cpu_vs_ort.py --threads 16 --batches 1,8 --runs 20 2>&1 | grep "^|"
exit 0
