#!/usr/bin/env bash
# A benchmark from two trees in turns: the working tree and an older one unpacked into _before
# (git archive REV | tar -x -C _before), each in its own process; BENCH is the benchmark (the CPU against
# onnxruntime unless said), and only its tables' rows are printed.
#   ROUNDS=2 ARGS="--threads 16 --batches 1 --models yolov8n,cls,minilm --runs 20" bash tools/ab_trees.sh
#   BENCH=benchmarks/gpu.py ARGS="--backends cuda,opencl,vulkan --precisions fp32 --no-torch --skip-extra" \
#     bash tools/ab_trees.sh
# On the GPU machine, run after tools/cpu_on_gpu_machine.sh's setup (MODELS=none) or tools/gpu_setup.sh.
set -uo pipefail
ln -sfn ../backends aiomnn/backends
ln -sfn ../backends _before/aiomnn/backends
for r in $(seq "${ROUNDS:-2}"); do
  for tree in _before .; do
    echo "== round $r, tree $tree"
    (cd "$tree" && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ${PREFIX:-} python3 ${BENCH:-benchmarks/cpu_vs_ort.py} ${ARGS:-}) 2>&1 | grep "^|"
  done
done
