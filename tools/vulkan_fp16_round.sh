#!/usr/bin/env bash
# Vulkan fp16 on the lent GPU machine, with and without cooperative matrices (AIOMNN_VULKAN_NO_COOP), beside
# CUDA fp16: what the device offers, the coop tests, then benchmarks/gpu.py in fp16. Through the device tool:
#     run(command="bash tools/vulkan_fp16_round.sh", carry=[".cache/lc", ".models"], timeout_s=600)
# MODELS (default rec,yolov8n,det), BATCHES (default 1,8) and N (default 20) pick the cases; STEPS the parts
# (default "device tests bench"); CUDA=0 leaves CUDA out of the bench, COOPS=1 the run without coop.
set -u
source tools/gpu_setup.sh >/dev/null 2>&1
M="${MODELS:-rec,yolov8n,det}"; B="${BATCHES:-1,8}"; N="${N:-20}"
for step in ${STEPS:-device tests bench}; do
  case "$step" in
    device) python3 - <<'PY'
import aiomnn
from aiomnn.backends.vulkan import device as d
cfg = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(precision="low"))
info = aiomnn.create_runtime(cfg)
ctx = info.runtimes[aiomnn.ForwardType.VULKAN].ctx
print("device", ctx.info.name, "coop", ctx.coop, "storage16", ctx.storage16)
try:
    q = d.vk.vkGetInstanceProcAddr(d.instance(), "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV")
    print("fragments", [(p.MSize, p.NSize, p.KSize, p.AType, p.CType, p.scope) for p in q(ctx.physical)])
except Exception as exc:
    print("no fragment query:", exc)
info.close()
PY
    ;;
    tests) python3 -m pytest tests/test_vulkan.py -q -p no:cacheprovider \
             -k "coop or register_tiles or fp16 or matmul_every or pointwise or real" 2>&1 | tail -4 ;;
    bench) for coop in ${COOPS:-1 0}; do
             echo "== Vulkan fp16, cooperative matrices $coop"
             if [ "$coop" = 1 ]; then unset AIOMNN_VULKAN_NO_COOP; else export AIOMNN_VULKAN_NO_COOP=1; fi
             python3 benchmarks/gpu.py --models "$M" --batches "$B" --backends vulkan --precisions fp16 --n "$N" \
               --no-torch --skip-extra 2>&1 | grep "^| [a-z]" | head -8
           done
           unset AIOMNN_VULKAN_NO_COOP
           [ "${CUDA:-1}" = 1 ] || continue
           echo "== CUDA fp16"
           python3 benchmarks/gpu.py --models "$M" --batches "$B" --backends cuda --precisions fp16 --n "$N" \
             --no-torch --skip-extra 2>&1 | grep "^| [a-z]" | head -8 ;;
  esac
done
