#!/usr/bin/env bash
# Experiment on an AVX-512 machine: numba's loops compiled with LLVM told to prefer 512-bit vectors (Intel
# server cores are tuned to prefer 256-bit), against the default, on yolov8n and det against onnxruntime.
#   EXTRA="bash tools/wide_vectors.sh" bash tools/cpu_on_gpu_machine.sh   (on the lent machine)
feat=$(python3 -c 'import llvmlite.binding as ll; print(ll.get_host_cpu_features().flatten() + ",-prefer-256-bit")')
NUMBA_CPU_FEATURES="$feat" python3 -c "
from aiomnn.backends.cpu import loops
f = loops.compile('conv_tiles')
asm = next(iter(f.inspect_asm().values()))
print('512-bit preferred: tile loop zmm', asm.count('zmm'), 'ymm', asm.count('ymm'))" 2>&1 | grep -v Warn
for how in default wide; do
  if [ "$how" = wide ]; then export NUMBA_CPU_FEATURES="$feat"; fi
  echo "== $how"
  python3 benchmarks/cpu_vs_ort.py --models yolov8n,det --threads 1,16 --batches 1 --runs 10 | grep '^| [a-z]'
done
