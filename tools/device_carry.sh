#!/usr/bin/env bash
# What the lent GPU machine's calls carry, made here once a session (both folders are ignored by git):
#   .cache/lc/gl   the loader debs tools/gpu_setup.sh unpacks there (Vulkan, the OpenCL ICD loader, glvnd);
#   .cache/lc/whl  the cp312 wheels that machine lacks (pyopencl, vulkan and their needs, pytest-asyncio, trio);
#   .models        the public CNNs as `aiomnn models fetch` cached them (MiniLM is too large to carry: the
#                  machine makes a stand-in of its shapes, tools/stand_in_models.py).
#     bash tools/device_carry.sh
set -eu
mkdir -p .cache/lc/gl .cache/lc/whl .models /tmp/amd64/partial
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
[ -n "$(ls .cache/lc/gl)" ] || { apt-get $o update -qq && (cd .cache/lc/gl && apt-get $o download -qq \
  libvulkan1 ocl-icd-libopencl1 libglvnd0 libegl1 libopengl0 libgl1 libglx0 libgles2); }
plats="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
       --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64"
for spec in pyopencl==2026.1.4 vulkan==1.3.275.1 cffi==2.0.0 pycparser==3.0 pytools==2026.1.1 \
            platformdirs==4.14.8 siphash24==1.9 sniffio==1.3.1 typing_extensions==4.16.0 pytest-asyncio==1.5.0 \
            trio==0.35.0 outcome==1.3.0.post0 sortedcontainers==2.4.0 attrs==26.1.0 idna==3.13; do
  ls .cache/lc/whl | grep -qi "^${spec%%==*}-" || python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp $plats -d .cache/lc/whl "$spec"
done
models="$(python3 -c 'from aiomnn import models; import os; print(os.path.dirname(models.path("det")))')"
for f in "$models"/*.onnx; do
  case "$f" in *MiniLM*) ;; *) cp -u "$f" .models/ ;; esac
done
du -sh .cache/lc .models
