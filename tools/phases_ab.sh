#!/usr/bin/env bash
# Two trees' CUDA runs on the lent GPU machine, in turns: the working tree against an older one unpacked into
# _before (git archive REV | tar -x -C _before). The CUDA tests of the waits, then where a run's time goes
# (tools/cuda_run_phases.py, each tree its own process, cupy in and outputs on the device), then the
# tables (benchmarks/gpu.py through tools/ab_trees.sh). Through the device tool:
#     run(command="bash tools/phases_ab.sh", carry=[".cache/lc", ".models"], timeout_s=600)
# STEPS picks among tests, phases and tables (all three unless said); CASES: model:shape:precision for the
# phases; MODELS, BATCHES, ROUNDS, BACKENDS the tables'. Everything printed goes to $OUT/phases_ab.txt as well.
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
export AIOMNN_MODELS=$PWD/.models
ln -sfn ../backends aiomnn/backends
ln -sfn ../backends _before/aiomnn/backends
# Both trees timed by this tree's harness (it waits for numba's background compiles; older ones did not).
cp benchmarks/gpu.py _before/benchmarks/gpu.py
cp tools/cuda_run_phases.py _before/tools/cuda_run_phases.py
exec > >(tee "${OUT:-/tmp}/phases_ab.txt") 2>&1
steps=${STEPS:-tests phases tables}
[[ $steps == *tests* ]] && timeout 150 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -x \
  -k "wait_modes or waiter or watches or fp16_inputs or device_inputs or device_outputs" 2>&1 | tail -2
[[ $steps == *tests* ]] && timeout 150 python3 -m pytest tests/test_vulkan.py tests/test_poll.py -q \
  -p no:cacheprovider -k "watches or event_loop_completes or staged_and_fence or handed_over or looks" 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed" | head -8
[[ $steps == *phases* ]] && for case in ${CASES:-yolov8n:1x3x320x320:low yolov8n:8x3x320x320:low yolov8n:8x3x320x320:normal rec:8x3x48x320:low}; do
  IFS=: read -r model shape precision <<< "$case"
  for tree in _before .; do
    echo "== $case, tree $tree"
    (cd "$tree" && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 200 python3 tools/cuda_run_phases.py --model "$model" --shapes "$shape" \
      --precision "$precision" --device --tuning normal --runs 60 2>&1 | grep -E "waits ended|^\| [0-9]")
  done
done
[[ $steps == *tables* ]] && ROUNDS=${ROUNDS:-2} BENCH=benchmarks/gpu.py ARGS="--models ${MODELS:-yolov8n,rec} --batches ${BATCHES:-1,8} \
  --backends ${BACKENDS:-cuda} --precisions fp32,fp16 --n 15 --no-torch --skip-extra" timeout 300 bash tools/ab_trees.sh \
  | grep -E "^== |^\| [a-z0-9]+ [0-9x]+ \| [0-9]" | awk '!/e-0/' 
