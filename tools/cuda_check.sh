#!/usr/bin/env bash
# A short check of CUDA changes on the lent GPU machine: tests/test_cuda.py in three shards at once (the conv
# algorithms, the tensor-core convs and single ops, the fused chains and real models), then one model's batch-8
# table against torch. Through the device tool:
#     run(command="bash tools/cuda_check.sh", carry=[".cache/lc", ".models"], timeout_s=540)
# MODELS and PRECISIONS pick the table's rows (default yolov8n, fp32); TESTS_S bounds each shard's seconds: in
# session 40, on a fresh machine with the three shards at once, 95 s ran 44 of the 168 conv_algorithms tests.
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
export AIOMNN_MODELS=$PWD/.models
shard() { timeout "${TESTS_S:-300}" python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -k "$1" > "$OUT/$2.txt" 2>&1; }
shard "conv_algorithms" algos &
shard "mma or op_fp32 or op_fp16" ops &
shard "not conv_algorithms and not mma and not op_fp and not attention and not tuner" rest &
wait  # on the shards' own PIDs: a pgrep on their command line would match this script too
for s in algos ops rest; do echo "== $s: $(tail -1 "$OUT/$s.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/$s.txt" | head -5; done
timeout "${BENCH_S:-150}" python3 benchmarks/gpu.py --models "${MODELS:-yolov8n}" --batches 8 --backends cuda \
  --precisions "${PRECISIONS:-fp32}" --n 15 --skip-extra 2>&1 | grep -v "^\s*$" | grep "^|" | tail -12
