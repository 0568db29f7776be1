#!/usr/bin/env bash
# The CPU backend against onnxruntime on 2 cores of the lent GPU machine (taskset), where nothing else runs: the
# 2-core VM's targets, measured where the timings hold still. Run after tools/cpu_on_gpu_machine.sh's setup:
#   MODELS=none EXTRA="bash tools/pinned_study.sh" bash tools/cpu_on_gpu_machine.sh
# CORES picks the cores (default 2,3); each step is one of the project's benchmarks or tools.
set -uo pipefail
CORES="${CORES:-2,3}"
pin() { taskset -c "$CORES" "$@"; }
lscpu | grep -E "Model name|Thread|MHz" | head -4
pin python3 benchmarks/conv_vs_ort.py --threads 2 --kinds first,s2,s2b,s2c,s1,pw32 --runs 40
pin python3 tools/conv_phases.py --kinds first,s2,s2b,s2c,s1 --threads 1,2 --runs 60
pin python3 benchmarks/cpu_vs_ort.py --threads 2 --batches 1,8 --models yolov8n,minilm --runs 20
pin python3 benchmarks/cpu_ops.py yolov8n --threads 2 --runs 20 --ort --top 5 --nodes 20
pin python3 tools/step_times.py minilm 1x16 2 --runs 100
pin python3 benchmarks/cpu_ops.py minilm --shape 1x16 --threads 2 --runs 50 --ort --top 5 --nodes 25
