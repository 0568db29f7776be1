"""The Vulkan backend's compute kernels: where the shaders are, what each one binds, which workgroup sizes are
fixed in the shader, which kernels take their push constants as specialization constants, and Kernel, the
compute pipeline for one shader and its settings. device.Context makes and keeps the kernels (Context.kernel);
these tables are what launch.py, record.py and the shaders themselves agree on, so they live apart from
setting up the device.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

import vulkan as vk

if TYPE_CHECKING:
    from .device import Context

ffi = vk.ffi

SHADER_DIR = Path(__file__).resolve().parent / "shaders"

#: Bindings per kernel: output first, then inputs (see shaders/*.comp).
KERNEL_BINDINGS = {"unary": 2, "binary": 3, "copy": 2, "conv": 4, "convt": 4, "matmul": 6, "matmul_direct": 6,
                   "matmul_small": 6, "se": 6,  # out, x, w1, b1, w2, b2
                   "pool": 2, "reduce": 2, "softmax": 2, "layernorm": 4, "resize": 3,
                   "conv_gemm": 6,  # out, x, w, bias, partial sums, tile counters
                   "conv_narrow": 6,  # conv_gemm's bindings (it reads the first four)
                   "cast": 2, "raster": 2}  # (raster: the output, then the input a region reads)  # device tensor, float32 host staging
#: Kernels whose workgroup size is fixed in the shader (tiles in shared memory).
FIXED_LOCAL = {"matmul": (16, 16, 1)}
#: matmul's register-blocked tiles (launch.REG_TILES: rows x columns), kernels of their own from matmul.comp,
#: with its bindings, specialization and their fixed workgroup size.
REG_TILE_LOCAL = {"matmul_128x64": (16, 16, 1), "matmul_64x128": (16, 16, 1), "matmul_64x64": (16, 8, 1),
                  "matmul_128x128": (16, 16, 1)}
KERNEL_BINDINGS.update(dict.fromkeys(REG_TILE_LOCAL, KERNEL_BINDINGS["matmul"]))
FIXED_LOCAL.update(REG_TILE_LOCAL)
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
SPECIALIZED = {"conv", "conv_gemm", "conv_narrow", "convt", "matmul", "matmul_direct", "matmul_small", "se",
               *REG_TILE_LOCAL, *CONV_REG_LOCAL}
PUSH_ID = 16


class Kernel:
    """A compute pipeline for one shader, storage variant, workgroup size and specialization.

    Specialization constants 0-2 are the workgroup size; 3 on are the shader's own
    (op codes, fused activation, rank), so the driver compiles only the branch used;
    PUSH_ID on are the push-constant words of a SPECIALIZED kernel (`words`).

    The pipeline compiles on the context's compiler threads (`compiled` is done when it
    has): a model's layers (and the tuner's candidates) compile side by side, and
    `pipeline` waits for its own.
    """

    def __init__(self, ctx: "Context", name: str, fp16: bool, local: tuple[int, int, int],
                 consts: tuple[int, ...] = (), words: bytes = b""):
        self.name, self.fp16, self.local, self.consts = name, fp16, local, consts
        self.specialized = name in SPECIALIZED  # takes no push constants
        self.nbind = KERNEL_BINDINGS[name]
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
        module = ctx.shader_module(name + ("_fp16" if fp16 else ""))
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
        self.compiled = ctx.compiler.submit(self._compile, dev, ctx.pipeline_cache, info, keep)
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
