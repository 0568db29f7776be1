#!/usr/bin/env bash
# The CPU benchmark against onnxruntime from two trees in turns, on the GPU machine's CPU: the working tree and
# an older one unpacked into _before (git archive REV | tar -x -C _before), each in its own process.
#   ROUNDS=2 ARGS="--threads 16 --batches 1 --models yolov8n,cls,minilm --runs 20" bash tools/ab_trees.sh
# Run after tools/cpu_on_gpu_machine.sh's setup (MODELS=none), with its PYTHONPATH and LD_LIBRARY_PATH.
set -uo pipefail
ln -sfn ../backends aiomnn/backends
ln -sfn ../backends _before/aiomnn/backends
for r in $(seq "${ROUNDS:-2}"); do
  for tree in _before .; do
    echo "== round $r, tree $tree"
    (cd "$tree" && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ${PREFIX:-} python3 benchmarks/cpu_vs_ort.py ${ARGS:-}) 2>&1 | grep "^|"
  done
done
