#!/usr/bin/env bash
# YOLOv8n b1 on Vulkan in half floats, with cooperative matrices and without (AIOMNN_VULKAN_NO_COOP=1), on the lent
# GPU machine: which kernels tuning chose for the convs (from the tuning cache), each conv's device time from a
# profile (tools/gpu_profiles.sh), and the run's time with numpy in and out (benchmarks/gpu.py). Through the device
# tool, carrying .cache/lc and .models:
#     bash tools/vulkan_b1_coop.sh
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
case_=yolov8n:images=1x3x320x320:vulkan:low
name=yolov8n_1x3x320x320_vulkan_low
for mode in coop nocoop; do
  rm -f "/tmp/$name.cache"
  if [ "$mode" = nocoop ]; then export AIOMNN_VULKAN_NO_COOP=1; fi
  CASES="$case_" TOP=4 bash tools/gpu_profiles.sh
  cp "$OUT/$name.json" "$OUT/$mode.json"
  python3 - "/tmp/$name.cache" <<'PY'
import collections, json, sys
text = json.load(open(sys.argv[1]))
kinds = collections.Counter()
for entries in text["devices"].values():  # the cache's entries by device: {key: {"choice": ..., "us": ...}}
    for value in entries.values():
        kinds[str(value.get("choice"))] += 1
print("tuned choices:", kinds.most_common(12))
PY
  timeout 150 python3 benchmarks/gpu.py --models yolov8n --batches 1 --backends vulkan --precisions fp16 --n 30 \
    --no-torch --skip-extra 2>&1 | grep "^| yolov8n" | head -1
done
python3 - "$OUT/coop.json" "$OUT/nocoop.json" <<'PY'
import json, statistics, sys
def convs(path):
    out = {}
    for e in json.load(open(path))["traceEvents"]:
        if e.get("ph") == "X" and e["name"].endswith("Conv"):
            out.setdefault(e["name"], []).append(e["dur"])
    return {k: statistics.median(v) for k, v in out.items()}
a, b = convs(sys.argv[1]), convs(sys.argv[2])
print("convs, device us a run: coop", round(sum(a.values()), 1), "no coop", round(sum(b.values()), 1))
for k in sorted(a, key=lambda k: -a[k])[:12]:
    print(f"  {k[:45]:45s} coop {a[k]:6.1f}  no coop {b.get(k, 0):6.1f}")
PY
