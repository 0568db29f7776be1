#!/usr/bin/env bash
# conv_coop's split sums on the lent GPU machine: one conv's outputs against the partial sums they may hold
# (tools/coop_debug.py), conv_coop's tests, and, where they pass, YOLOv8n and rec at batch 1 in both precisions
# with a profile of YOLOv8n's Vulkan fp16 convs (tools/fp16_check.sh). Through the device tool:
#     run(command="bash tools/coop_debug.sh", carry=[".cache/lc", ".models"], timeout_s=400)
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
python3 tools/coop_debug.py 2>&1 | tail -4 | cut -c1-200
timeout 100 python3 -m pytest tests/test_vulkan.py -q -p no:cacheprovider -k "conv_coop or coop_is" > "$OUT/coop.txt" 2>&1
grep -E "passed|failed|^FAILED|AssertionError" "$OUT/coop.txt" | head -6
grep -q failed "$OUT/coop.txt" && exit 1
STEPS="profile table" MODELS=yolov8n,rec BATCHES=1 bash tools/fp16_check.sh 2>&1 | grep -v "^|---" | tail -24
