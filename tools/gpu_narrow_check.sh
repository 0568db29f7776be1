#!/usr/bin/env bash
# The narrow convs (aiomnn/narrow.py: Vulkan's conv_narrow split ways, OpenCL's conv_narrow) and the transposed
# convs (Vulkan's convt and convt_tile, OpenCL's deconv_tile) on the lent GPU machine: their tests on NVIDIA's
# drivers, then det's tables with each conv candidate's tuning time (tools/conv_candidates.py), Vulkan beside CUDA
# in both precisions and OpenCL beside CUDA in fp32 (OpenCL does not take precision low). Through the device tool:
#     run(command="bash tools/gpu_narrow_check.sh", carry=[".cache/lc", ".models"], timeout_s=600)
# MODELS and BATCHES pick the tables' rows (default det, 1,8).
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
export AIOMNN_MODELS=$PWD/.models
timeout 120 python3 -m pytest tests/test_vulkan.py -q -p no:cacheprovider \
  -k "narrow or convtranspose or fused_conv_takes or resize" > "$OUT/vk.txt" 2>&1 &
timeout 120 python3 -m pytest tests/test_opencl.py tests/test_opencl_fusion.py -q -p no:cacheprovider \
  -k "tile or split or fused_launch_runs or deconv or upsampling" > "$OUT/cl.txt" 2>&1 &
wait  # on the two test runs' own PIDs
for s in vk cl; do echo "== $s: $(tail -1 "$OUT/$s.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/$s.txt" | head -5; done
table() {  # backends precisions seconds file
  timeout "$3" python3 tools/conv_candidates.py -- --models "${MODELS:-det}" --batches "${BATCHES:-1,8}" \
    --backends "$1" --precisions "$2" --n 20 --no-torch --skip-extra > "$OUT/$4" 2>&1
  grep "^|" "$OUT/$4" | head -14
}
table cuda,vulkan fp32,fp16 170 vk_tab.txt
table cuda,opencl fp32 200 cl_tab.txt
grep -h "narrow\|convt\|deconv" "$OUT"/*_tab.txt | cut -c1-260 | head -40
