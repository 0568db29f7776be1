"""Workgroup-size tuning for Vulkan dispatches, as aiomnn.tuning TuneTasks.

An op is planned on a dry backend (no device memory, no weight uploads) to
learn its launches. Timing runs one launch on zero-filled buffers of the real
sizes, bracketed by GPU timestamps, once to warm up and then `samples` times.
On a GPU a large launch's timed dispatches start with cold caches (COLD_ABOVE).
"""

from __future__ import annotations

import contextlib
import math
from concurrent.futures import Future
from typing import Any, Iterator

import vulkan as vk

from aiomnn.graph import Node

from .launch import Launch
from .record import COMPUTE, SHADER_RW, TRANSFER, barrier, bind

ffi, lib = vk.ffi, vk.lib

#: A launch whose buffers add up to COLD_ABOVE bytes is timed with cold caches on a GPU: FLUSH_BYTES, more than a
#: large GPU's L2 cache holds (an H100's holds 50 MB), are written before each timed dispatch. In a model, a small
#: op finds its inputs in the cache, where the op before wrote them; a large one does not find them all, and timed
#: warm it can rank the wrong candidate first (det's 96 -> 24 channel 3x3 conv did). Timing every launch cold
#: chose worse for the small ones (YOLOv8n).
COLD_ABOVE = 8 << 20
FLUSH_BYTES = 128 << 20


def tasks_for(runtime: Any, backend: Any, node: Node, inputs: list, outputs: list) -> list["LaunchTuneTask"]:
    """The op's launches whose workgroup size can be tuned (every GPU backend's tasks_for takes the same arguments;
    here the op is planned alone, into a plan of its own on the runtime's dry backend, not the session's)."""
    from .ops import create

    dry = runtime.dry_backend()
    dry.clear_buffers()
    op = create(dry, node, inputs, outputs)
    if op is None:
        return []
    try:
        if op.alias_of is not None:
            return []
        op.on_resize(inputs, outputs)
    except Exception:
        return []
    finally:
        dry.clear_buffers()
    return [LaunchTuneTask(runtime, node, launch) for launch in op.launches if launch.tunable]


class LaunchTuneTask:
    """Which workgroup size (or matmul kernel) runs this launch fastest on this device."""

    def __init__(self, runtime: Any, node: Node, launch: Launch):
        self.runtime = runtime
        self.launch = launch
        self.key = launch.key
        self.label = f"{node} {launch.kernel} {launch.work}"
        self.cost = launch.work.cost  # what to tune first, where not every op is
        self.tried: list[Any] = []

    def candidates(self, limit: int) -> list[Any]:
        self.tried = self.launch.choices(limit)
        return self.tried

    def prepare(self, limit: int) -> list[Future]:
        """The candidates' pipelines start compiling on the programs' threads (a specialized kernel has one per
        layer and candidate, each a compile in the driver)."""
        launch = self.launch
        return [self.runtime.programs.kernel(name, launch.fp16, local, launch.consts, launch.push).compiled
                for name, local, _ in map(launch.resolve, self.candidates(limit))]

    @contextlib.contextmanager
    def timer(self) -> Iterator[Any]:
        rt, launch = self.runtime, self.launch
        ctx = rt.ctx
        dev = ctx.device
        buffers = []
        for loc in launch.locs:
            buf = ctx.device_buffer(max(loc.nbytes, 16))
            if buf.host is not None:
                buf.host[:] = 0
            else:
                ctx.run_once(lambda cmd, b=buf: vk.vkCmdFillBuffer(cmd, b.handle, 0, b.size, 0), rt.queue)
            buffers.append(buf)
        nb = len(buffers)
        flush = None
        if ctx.info.is_gpu and sum(loc.nbytes for loc in launch.locs) >= COLD_ABOVE:
            with contextlib.suppress(Exception):  # a device without room for it times the launch warm
                flush = ctx.device_buffer(FLUSH_BYTES)
        pool = vk.vkCreateDescriptorPool(dev, vk.VkDescriptorPoolCreateInfo(
            flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT, maxSets=1, poolSizeCount=1,
            pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=nb)]),
            None)
        queries = vk.vkCreateQueryPool(dev, vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                                                                     queryCount=64), None)

        def time(candidate: Any, samples: int) -> float:
            name, local, groups = launch.resolve(candidate)
            if any(g > m for g, m in zip(groups, ctx.max_groups)):
                raise ValueError(f"grid {groups} over the device's limit")
            kernel = rt.programs.kernel(name, launch.fp16, local, launch.consts, launch.push)
            vk.vkResetDescriptorPool(dev, pool, 0)
            dset = vk.vkAllocateDescriptorSets(dev, vk.VkDescriptorSetAllocateInfo(
                descriptorPool=pool, descriptorSetCount=1, pSetLayouts=[kernel.set_layout]))[0]
            infos = [vk.VkDescriptorBufferInfo(buffer=b.handle, offset=0, range=max(loc.nbytes, 4))
                     for b, loc in zip(buffers, launch.locs)]
            writes = [vk.VkWriteDescriptorSet(dstSet=dset, dstBinding=i, descriptorCount=1,
                                              descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=[info])
                      for i, info in enumerate(infos)]
            vk.vkUpdateDescriptorSets(dev, len(writes), writes, 0, None)
            # The pool holds 32 pairs of timestamps: the last 32 dispatches are timed, earlier ones (a warm-up
            # asks for thousands) only keep the device busy.
            n = samples + 1
            n_timed = min(n, 32)

            def record(cmd) -> None:
                vk.vkCmdResetQueryPool(cmd, queries, 0, 2 * n_timed)
                bind(cmd, kernel, dset, launch.push)
                for j in range(-(n - n_timed), n_timed):  # the untimed ones first
                    if j >= 0 and flush is not None:
                        lib.vkCmdFillBuffer(cmd, flush.handle, 0, flush.size, j)
                        barrier(cmd, TRANSFER, COMPUTE, vk.VK_ACCESS_TRANSFER_WRITE_BIT, SHADER_RW)
                    if j >= 0:
                        lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries, 2 * j)
                    lib.vkCmdDispatch(cmd, *groups)
                    if j >= 0:
                        lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, 2 * j + 1)
                    barrier(cmd, COMPUTE, COMPUTE, vk.VK_ACCESS_SHADER_WRITE_BIT, SHADER_RW)

            ctx.run_once(record, rt.queue)
            data = ffi.new("uint64_t[]", 2 * n_timed)
            r = lib.vkGetQueryPoolResults(dev, queries, 0, 2 * n_timed, 16 * n_timed, data, 8,
                                          vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
            if r != vk.VK_SUCCESS:
                raise RuntimeError(f"vkGetQueryPoolResults: VkResult {r}")
            times = [(data[2 * i + 1] - data[2 * i]) * ctx.timestamp_period * 1e-9 for i in range(1, n_timed)]
            return min(times) if times else math.inf

        try:
            yield time
        finally:
            vk.vkDestroyQueryPool(dev, queries, None)
            vk.vkDestroyDescriptorPool(dev, pool, None)
            for b in buffers:
                b.destroy()
            if flush is not None:
                flush.destroy()
