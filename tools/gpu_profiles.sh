#!/usr/bin/env bash
# Per-op profiles on the lent GPU machine: for each case, a session tunes once into a cache file, then a second
# session reads that cache and profiles its runs (`aiomnn run --profile`), and tools/trace_ops.py sums the trace by
# op type. Through the device tool:
#     run(command="CASES='rec:x=8x3x48x320:vulkan:low rec:x=8x3x48x320:cuda:low' bash tools/gpu_profiles.sh",
#         carry=[".cache/lc", ".models"])
# A case is MODEL:SHAPE:BACKEND:PRECISION, MODEL one of det, rec, cls, yolov8n; TUNING (default normal) and TOP
# (default 14) apply to all. Traces are left in $OUT.
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
declare -A FILE=([det]=ch_PP-OCRv4_det_infer [rec]=ch_PP-OCRv4_rec_infer [cls]=ch_ppocr_mobile_v2.0_cls_infer
                 [yolov8n]=320n)
for case in ${CASES:?}; do
  IFS=: read -r model shape backend precision <<< "$case"
  name="${model}_${shape#*=}_${backend}_${precision}"
  cache="/tmp/$name.cache"
  common=(".models/${FILE[$model]}.onnx" --backend "$backend" --shape "$shape" --precision "$precision"
          --concurrency 1 --tuning "${TUNING:-normal}" --cache "$cache")
  python3 -m aiomnn.cli run "${common[@]}" --requests 5 >/dev/null 2>&1
  echo "== $name"
  python3 -m aiomnn.cli run "${common[@]}" --requests 40 --profile "$OUT/$name.json" > /tmp/out.txt 2>&1 \
    || tail -5 /tmp/out.txt
  python3 tools/trace_ops.py "$OUT/$name.json" --top "${TOP:-14}"
done
