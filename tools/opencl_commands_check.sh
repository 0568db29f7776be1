#!/usr/bin/env bash
# OpenCL's command buffers and the event loop's looks on the lent GPU machine: whether the driver records command
# buffers (tools/opencl_command_buffer.py: a chain of small dependent kernels one by one and recorded, on a
# profiling queue and a plain one), the OpenCL tests that use them, then the tables as shipped, without command
# buffers (AIOMNN_OPENCL_COMMAND_BUFFERS=0) and without the loop's looks (AIOMNN_OPENCL_WAIT=thread), in turns,
# CUDA beside each. Through the device tool:
#     run(command="bash tools/opencl_commands_check.sh", carry=[".cache/lc", ".models"], timeout_s=600)
# STEPS picks among probe, tests and tables (all three unless said); MODELS, BATCHES, ROUNDS and WAYS (pairs of
# command buffers and wait mode, as below) the tables'. A cold machine compiles every kernel in the first table.
# Everything printed goes to $OUT/opencl_commands.txt as well.
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
export AIOMNN_MODELS=$PWD/.models
ln -sfn ../backends aiomnn/backends
exec > >(tee "${OUT:-/tmp}/opencl_commands.txt") 2>&1
steps=${STEPS:-probe log tests tables}
[[ $steps == *probe* ]] && PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 90 python3 tools/opencl_command_buffer.py --kernels 100 \
  --sizes 4096,262144 --runs 30
# Whether a session's segments were recorded: the driver's refusals are logged at INFO.
[[ $steps == *log* ]] && timeout 120 python3 -c "
import logging, runpy, sys
logging.basicConfig(level=logging.INFO)
sys.argv = 'gpu.py --models cls --batches 1 --backends opencl --precisions fp32 --n 3 --no-torch --skip-extra'.split()
runpy.run_path('benchmarks/gpu.py', run_name='__main__')" 2>&1 | grep -i "command buffer\|kernel by kernel\|error" | head
[[ $steps == *tests* ]] && timeout 200 python3 -m pytest tests/test_opencl.py -q -p no:cacheprovider \
  -k "command_buffer or kernel_by_kernel or wait_modes or concurrent or cpu_fallback or ends_short_runs" 2>&1 | tail -3
if [[ $steps == *tables* ]]; then
  # (command buffers, wait mode): both on as shipped, then each taken off alone.
  for r in $(seq "${ROUNDS:-1}"); do
    for way in ${WAYS:-1:loop 0:loop 1:thread}; do
      commands=${way%%:*} wait=${way##*:}
      echo "== round $r, AIOMNN_OPENCL_COMMAND_BUFFERS=$commands AIOMNN_OPENCL_WAIT=$wait"
      AIOMNN_OPENCL_COMMAND_BUFFERS=$commands AIOMNN_OPENCL_WAIT=$wait timeout 300 python3 benchmarks/gpu.py \
        --models "${MODELS:-cls,yolov8n,rec}" --batches "${BATCHES:-1,8}" --backends cuda,opencl --precisions fp32 \
        --n 15 --no-torch --skip-extra 2>&1 | grep "^|"
    done
  done
fi
