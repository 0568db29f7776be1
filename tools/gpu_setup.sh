# Sourced by the scripts that run on the lent GPU machine through the device tool, carrying .cache/lc:
#     source tools/gpu_setup.sh
# .cache/lc/gl holds the loader debs (libvulkan1, ocl-icd-libopencl1, and libglvnd0 libegl1 libopengl0 libgl1
# libglx0 libgles2, which the NVIDIA Vulkan driver needs: without them VkErrorIncompatibleDriver on the H200);
# .cache/lc/whl the cp312 wheels the image lacks (pyopencl, vulkan, cffi, pycparser, pytools, platformdirs,
# siphash24, sniffio, typing_extensions, pytest-asyncio; trio, outcome, sortedcontainers, attrs, idna for the
# tests under trio), fetched as the device tool's README says.
# After it: CUDA, OpenCL (NVIDIA's driver through the ICD loader) and Vulkan see the GPU, aiomnn is installed
# from this tree, and OUT exists.
for f in .cache/lc/gl/*.deb; do dpkg -x "$f" /; done
ldconfig
# The NVIDIA Vulkan driver's manifest: the H200 machines keep a working one in /usr/share (the copy under
# /usr/local/nvidia gave VkErrorIncompatibleDriver there).
for f in /usr/share/vulkan/icd.d/nvidia_icd.json /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; do
  [ -e "$f" ] && export VK_DRIVER_FILES="$f" && break
done
export OUT="${OUT:-/tmp/out}" PYTHONUNBUFFERED=1 AIOMNN_MODELS="${AIOMNN_MODELS:-$PWD/.models}"
mkdir -p /tmp/icd "$OUT" && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .cache/lc/whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "install failed"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
