#!/usr/bin/env bash
# Issue 25's lifecycle proofs on the lent GPU machine, through the device tool. Carry .cache/lc: gl/ holds the
# loader debs (libvulkan1, ocl-icd-libopencl1, and libglvnd0 libegl1 libopengl0 libgl1 libglx0 libgles2, which
# the NVIDIA Vulkan driver needs: without them VkErrorIncompatibleDriver on the H200) and whl/ the cp312 wheels the image lacks (pyopencl, vulkan, cffi, pycparser, pytools,
# platformdirs, siphash24, sniffio, typing_extensions), fetched as the device tool's README says.
set -u
for f in .cache/lc/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
# The NVIDIA Vulkan driver's manifest: the H200 machines keep a working one in /usr/share (the copy under
# /usr/local/nvidia gave VkErrorIncompatibleDriver there).
for f in /usr/share/vulkan/icd.d/nvidia_icd.json /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; do
  [ -e "$f" ] && export VK_DRIVER_FILES="$f" && break
done
export OUT="${OUT:-/tmp/out}" PYTHONUNBUFFERED=1
mkdir -p /tmp/icd "$OUT" && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .cache/lc/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "install failed"
aiomnn info
# KIND:COUNT:SECONDS for each backend, where a leak is being hunted: sessions dropped without close, with the
# object types that grew (tools/leak_probe.py), e.g. LEAKS="cuda:1000:300 vulkan:300:120".
for spec in ${LEAKS:-}; do
  IFS=: read -r k n t <<<"$spec"
  SETTLE="${SETTLE:-20}" timeout "$t" python3 tools/leak_probe.py "$k" "$n" 2>&1 | head -40; echo "exit ${PIPESTATUS[0]}"
done | tee "$OUT/leak.txt"
[ "${TEST_SECONDS:-400}" -gt 0 ] || exit 0
# The lifecycle tests (1000 sessions dropped a backend); -s keeps each backend's line.
timeout "${TEST_SECONDS:-400}" python3 -m pytest -q -s -p no:cacheprovider \
  tests/test_lifecycle.py ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/lifecycle.txt"
