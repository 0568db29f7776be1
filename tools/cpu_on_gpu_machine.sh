#!/usr/bin/env bash
# The CPU backend on the lent GPU machine's 16 cores (run through the device tool, carrying .models with the
# four CNNs and .whl with sniffio; minilm is made there from random weights by tools/stand_in_models.py):
#   THREADS=1,2,4,8,16 BATCHES=1 MODELS=det,rec,cls,yolov8n,minilm PROFILE="minilm:8x128 yolov8n:1x3x320x320" \
#     bash tools/cpu_on_gpu_machine.sh
# PROFILE_THREADS="1 16" profiles at each; NODES=15 adds the costliest nodes; MODELS=none skips the comparison.
set -uo pipefail
export PYTHONUNBUFFERED=1 AIOMNN_MODELS="$PWD/.models" OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
# What the machine's image lacks travels as wheels in .whl (sniffio; see the device tool's README).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
python3 tools/stand_in_models.py .models
nproc; python3 -c "import numba, numpy, onnxruntime; print('numba', numba.__version__, 'numpy', numpy.__version__, 'ort', onnxruntime.__version__)"
grep -o -m1 'avx512[a-z]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
# The tile loop's vector registers, compiled into a fresh cache (numba shows no assembly of cached code).
NUMBA_CACHE_DIR=$(mktemp -d) python3 -c "
from aiomnn.backends.cpu import loops; import numba, llvmlite.binding as ll
from aiomnn.backends.cpu import tiles
asm = loops._compiled_piece(tiles.conv, True)._library.get_asm_str()
print('cpu', ll.get_host_cpu_name(), 'tile loop: zmm', asm.count('zmm'), 'ymm', asm.count('ymm'))"
for p in ${PROFILE:-}; do
  for t in ${PROFILE_THREADS:-16}; do
    python3 benchmarks/cpu_ops.py "${p%%:*}" --shape "${p#*:}" --threads "$t" --runs 10 --nodes "${NODES:-0}" 2>&1 \
      | tee -a "$OUT/ops.txt"
  done
done
[ "${MODELS:-}" = none ] || python3 benchmarks/cpu_vs_ort.py --threads "${THREADS:-1,2,4,8,16}" --batches "${BATCHES:-1}" --runs "${RUNS:-20}" \
  --models "${MODELS:-det,rec,cls,yolov8n,minilm}" 2>&1 | tee "$OUT/cpu_vs_ort.md"
# Any further command, in the same environment (e.g. EXTRA="python3 tools/ab_dense.py 1,4,16").
if [ -n "${EXTRA:-}" ]; then
  eval "$EXTRA" 2>&1 | tee "$OUT/extra.txt"
fi
