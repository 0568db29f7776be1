"""The Vulkan backend's programs: compute kernels made from the SPIR-V that tools/build_shaders.py builds from
shaders/*.comp, compiled once and kept, in memory (Programs, one per runtime) and on disk (the driver's
VkPipelineCache, saved next to the tuning cache).

The tables say what each kernel binds, which workgroup sizes are fixed in the shader and which kernels take
their push constants as specialization constants: launch.py, record.py and the shaders agree on them.
"""

from __future__ import annotations

import logging
import os
import struct
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import vulkan as vk

if TYPE_CHECKING:
    from .device import Context

log = logging.getLogger("aiomnn.vulkan")
ffi, lib = vk.ffi, vk.lib

SHADER_DIR = Path(__file__).resolve().parent / "shaders"
#: Compiled pipelines are saved to the tuning cache's file name with this added.
PIPELINE_SUFFIX = ".vkpipelines"

#: Bindings per kernel: output first, then inputs (see shaders/*.comp).
KERNEL_BINDINGS = {"unary": 2, "binary": 3, "copy": 2, "copy_rows": 2, "conv": 4, "conv_dw": 4, "convt": 4,
                   "convt_tile": 4,
                   "matmul": 6, "matmul_direct": 6, "matmul_small": 6, "se": 6,  # out, x, w1, b1, w2, b2
                   "pool": 2, "reduce": 2, "softmax": 2, "layernorm": 4, "resize": 3,
                   "conv_gemm": 6,  # out, x, w, bias, partial sums, tile counters
                   "conv_narrow": 6,  # conv_gemm's bindings (it reads the first four)
                   "cast": 2,  # the device tensor, the float32 host staging
                   "raster": 2,  # the output, then the input a region reads
                   "attention": 5}  # out, q, k, v, mask
#: Kernels whose workgroup size is fixed in the shader (tiles in shared memory).
FIXED_LOCAL = {"matmul": (16, 16, 1), "attention": (128, 1, 1)}
#: matmul's register-blocked tiles (launch.REG_TILES: rows x columns), kernels of their own from matmul.comp,
#: with its bindings, specialization and their fixed workgroup size.
REG_TILE_LOCAL = {"matmul_128x64": (16, 16, 1), "matmul_64x128": (16, 16, 1), "matmul_64x64": (16, 8, 1),
                  "matmul_128x128": (16, 16, 1)}
KERNEL_BINDINGS.update(dict.fromkeys(REG_TILE_LOCAL, KERNEL_BINDINGS["matmul"]))
FIXED_LOCAL.update(REG_TILE_LOCAL)
#: matmul and conv_gemm on cooperative matrices (sources of their own, half floats only): four subgroups of 32,
#: a 64 x 64 tile.
COOP_LOCAL = (128, 1, 1)
KERNEL_BINDINGS.update(matmul_coop=KERNEL_BINDINGS["matmul"], conv_coop=KERNEL_BINDINGS["conv_gemm"])
FIXED_LOCAL.update(matmul_coop=COOP_LOCAL, conv_coop=COOP_LOCAL)
#: conv_gemm's register-blocked tiles (launch.CONV_REG_TILES: output channels x pixels), the same way.
CONV_REG_LOCAL = {"conv_gemm_32x64": (16, 8, 1), "conv_gemm_32x128": (16, 8, 1), "conv_gemm_64x64": (16, 8, 1),
                  "conv_gemm_64x128": (16, 16, 1)}
KERNEL_BINDINGS.update(dict.fromkeys(CONV_REG_LOCAL, KERNEL_BINDINGS["conv_gemm"]))
FIXED_LOCAL.update(CONV_REG_LOCAL)
PUSH_BYTES = 128  # the minimum every device guarantees
#: Kernels that read their push-constant words as specialization constants instead: word i of a dispatch's
#: push block is constant PUSH_ID + i (a float keeps its bits), so the driver folds a layer's shapes into its
#: code (the divisions by them, the loop counts) and each layer gets its own pipeline. Their shaders declare
#: `layout(constant_id = 16 + i)` in the push block's order and have no push block.
SPECIALIZED = {"conv", "conv_dw", "conv_gemm", "conv_narrow", "convt", "convt_tile", "matmul", "matmul_direct",
               "matmul_small", "se", "attention", "matmul_coop", "conv_coop", "resize", *REG_TILE_LOCAL,
               *CONV_REG_LOCAL}
PUSH_ID = 16


class Kernel:
    """A compute pipeline for one shader, storage variant, workgroup size and specialization.

    Specialization constants 0-2 are the workgroup size; 3 on are the shader's own
    (op codes, fused activation, rank), so the driver compiles only the branch used;
    PUSH_ID on are the push-constant words of a SPECIALIZED kernel (`words`).

    The pipeline compiles on the programs' compiler threads (`compiled` is done when it
    has): a model's layers (and the tuner's candidates) compile side by side, and
    `pipeline` waits for its own.
    """

    def __init__(self, programs: "Programs", name: str, fp16: bool, local: tuple[int, int, int],
                 consts: tuple[int, ...] = (), words: bytes = b""):
        self.name, self.fp16, self.local, self.consts = name, fp16, local, consts
        self.specialized = name in SPECIALIZED  # takes no push constants
        self.nbind = KERNEL_BINDINGS[name]
        ctx = programs.ctx
        dev = ctx.device
        bindings = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                    descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                    for i in range(self.nbind)]
        self.set_layout = vk.vkCreateDescriptorSetLayout(
            dev, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=self.nbind, pBindings=bindings), None)
        push = [] if self.specialized else [
            vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=PUSH_BYTES)]
        self.layout = vk.vkCreatePipelineLayout(
            dev, vk.VkPipelineLayoutCreateInfo(setLayoutCount=1, pSetLayouts=[self.set_layout],
                                               pushConstantRangeCount=len(push), pPushConstantRanges=push), None)
        file = name + ("_fp16" if fp16 else "")
        module = ctx.shader_module(file, lambda: (SHADER_DIR / f"{file}.spv").read_bytes())
        values = list(local) + list(consts)
        ids = list(range(len(values))) + [PUSH_ID + i for i in range(len(words) // 4)]
        entries = [vk.VkSpecializationMapEntry(constantID=c, offset=4 * i, size=4) for i, c in enumerate(ids)]
        data = struct.pack(f"<{len(values)}i", *values) + words
        self._spec_data = ffi.new("char[]", data)
        spec = vk.VkSpecializationInfo(mapEntryCount=len(ids), pMapEntries=entries, dataSize=len(data),
                                       pData=self._spec_data)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module,
                                                   pName="main", pSpecializationInfo=spec)
        info = vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)
        keep = (stage, spec, entries)  # what `info` points into: alive until the compile is done
        self.compiled = programs.compiler.submit(self._compile, dev, programs.cache, info, keep)
        self._dev = dev

    @staticmethod
    def _compile(dev, cache, info, keep):
        return vk.vkCreateComputePipelines(dev, cache, 1, [info], None)[0]

    @property
    def pipeline(self):
        return self.compiled.result()

    def destroy(self) -> None:
        if self.compiled.exception() is None:
            vk.vkDestroyPipeline(self._dev, self.pipeline, None)
        vk.vkDestroyPipelineLayout(self._dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(self._dev, self.set_layout, None)


class Programs:
    """A device's kernels, each made on first use and kept until the runtime closes, and the VkPipelineCache
    they compile through, which a later process loads to skip the driver's compiles."""

    def __init__(self, ctx: "Context"):
        self.ctx = ctx
        self.cache = vk.vkCreatePipelineCache(ctx.device, vk.VkPipelineCacheCreateInfo(), None)
        self._kernels: dict[tuple, Kernel] = {}
        self._lock = threading.Lock()
        # Specialized kernels make a pipeline per layer, each a compile in the driver: side by side, a model's
        # first run comes about as soon as it did with one shared pipeline per kernel.
        self.compiler = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1),
                                           thread_name_prefix="aiomnn-vk-compile")

    def kernel(self, name: str, fp16: bool = False, local: tuple[int, int, int] = (64, 1, 1),
               consts: tuple[int, ...] = (), push: bytes = b"") -> Kernel:
        """The pipeline for these settings, made on first use; `push` (a dispatch's push constants) is part of
        a SPECIALIZED kernel's pipeline and ignored for the others."""
        local = FIXED_LOCAL.get(name, local)
        consts = tuple(int(c) for c in consts)
        words = bytes(push) if name in SPECIALIZED else b""
        key = (name, fp16, local, consts, words)
        k = self._kernels.get(key)
        if k is None:
            with self._lock:
                k = self._kernels.get(key)
                if k is None:
                    k = self._kernels[key] = Kernel(self, name, fp16, local, consts, words)
        return k

    # The pipeline cache ------------------------------------------------------------
    def cache_fits(self, data: bytes) -> bool:
        """Whether pipeline-cache bytes carry this device's header (vendor, device, cache UUID)."""
        if len(data) < 32:
            return False
        props = self.ctx.props
        size, version, vendor, device = struct.unpack_from("<4I", data, 0)
        uuid = bytes(data[16:32])
        return (size >= 32 and version == vk.VK_PIPELINE_CACHE_HEADER_VERSION_ONE
                and vendor == props.vendorID and device == props.deviceID
                and uuid == bytes(ffi.buffer(props.pipelineCacheUUID)))

    def cache_bytes(self) -> bytes:
        """The pipeline cache's contents (compiled pipelines), to save and merge() in a later process."""
        n = ffi.new("size_t*")
        if lib.vkGetPipelineCacheData(self.ctx.device, self.cache, n, ffi.NULL) != vk.VK_SUCCESS:
            return b""
        buf = ffi.new("char[]", n[0])
        if lib.vkGetPipelineCacheData(self.ctx.device, self.cache, n, buf) != vk.VK_SUCCESS:
            return b""
        return bytes(ffi.buffer(buf, n[0]))

    def merge(self, data: bytes) -> bool:
        """Merge pipeline-cache data saved by an earlier process; False (and ignored) when it does not fit."""
        if not data or not self.cache_fits(data):
            return False
        dev = self.ctx.device
        buf = ffi.new("char[]", bytes(data))
        try:
            src = vk.vkCreatePipelineCache(dev, vk.VkPipelineCacheCreateInfo(
                initialDataSize=len(data), pInitialData=buf), None)
        except Exception as exc:
            log.warning("ignoring unreadable Vulkan pipeline-cache data: %s", exc)
            return False
        try:
            vk.vkMergePipelineCaches(dev, self.cache, 1, [src])
        finally:
            vk.vkDestroyPipelineCache(dev, src, None)
        return True

    def load(self, cache_file: str) -> None:
        """Merge the pipelines saved next to the tuning cache `cache_file`, if there are any for this device."""
        path = cache_file + PIPELINE_SUFFIX
        try:
            with open(path, "rb") as f:
                data = f.read(256 << 20)
        except OSError:
            return
        if not self.merge(data):
            log.warning("ignoring %s: a pipeline cache for another device or driver", path)

    def save(self, cache_file: str | None) -> None:
        """Write the pipeline cache next to the tuning cache `cache_file`, atomically (a temporary file, then
        rename)."""
        if not cache_file:
            return
        data = self.cache_bytes()
        if not data:
            return
        path = cache_file + PIPELINE_SUFFIX
        try:
            fd, tmp = tempfile.mkstemp(prefix=".vkpipelines-", dir=os.path.dirname(os.path.abspath(path)))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write the Vulkan pipeline cache %s: %s", path, exc)

    def destroy(self) -> None:
        """Stop the compiler threads and destroy every kernel and the cache (before the device goes)."""
        vk.vkDeviceWaitIdle(self.ctx.device)
        self.compiler.shutdown()
        for k in self._kernels.values():
            k.destroy()
        self._kernels.clear()
        vk.vkDestroyPipelineCache(self.ctx.device, self.cache, None)
