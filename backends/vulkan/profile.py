"""Device time of each dispatch of a recorded Vulkan segment, from timestamp queries.

For tools (which kernels dominate a model) and for comparing shader changes; not for serving: it
blocks until the device is done.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import vulkan as vk

from aiomnn.errors import BackendError

from .record import COMPUTE, SHADER_RW, TRANSFER, TRANSFER_RW, barrier, bind

if TYPE_CHECKING:
    from aiomnn.pipeline import Segment

    from .backend import VulkanBackend

ffi, lib = vk.ffi, vk.lib


def profile(backend: "VulkanBackend", segment: "Segment", values: dict[str, Any],
            repeat: int = 3) -> list[tuple[str, str, float]]:
    """Device time of every dispatch of a segment, in seconds: (node name, kernel, best of `repeat`).

    Blocking; for tools and tuning, not for serving. Inputs are taken from `values`.
    """
    dispatches = [(s.node, d) for s in segment.steps for d in s.execution.dispatches]
    if not dispatches:
        return []
    rec = backend.record_of(segment)
    for name, view, shape in rec.uploads:
        np.copyto(view, values[name], casting="unsafe")
    # One whole run first: it brings the inputs in (fp16 casts them on the device) and warms up.
    backend.queue.wait_value(backend.queue.submit(rec.slot().sub, lambda err: None))
    dev = backend.ctx.device
    n = 2 * len(dispatches)
    pool = vk.vkCreateQueryPool(dev, vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                                                              queryCount=n), None)
    best = [math.inf] * len(dispatches)
    try:
        for _ in range(repeat):
            def record(cmd):
                vk.vkCmdResetQueryPool(cmd, pool, 0, n)
                barrier(cmd, COMPUTE | TRANSFER, COMPUTE, SHADER_RW | TRANSFER_RW, SHADER_RW)
                for i, (_, d) in enumerate(dispatches):
                    bind(cmd, d.kernel, d.set, d.push)
                    lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, 2 * i)
                    lib.vkCmdDispatch(cmd, *d.groups)
                    lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 2 * i + 1)
                    barrier(cmd, COMPUTE, COMPUTE, vk.VK_ACCESS_SHADER_WRITE_BIT, SHADER_RW)

            backend.ctx.run_once(record, backend.queue)
            data = ffi.new("uint64_t[]", n)
            r = lib.vkGetQueryPoolResults(dev, pool, 0, n, 8 * n, data, 8,
                                          vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
            if r != vk.VK_SUCCESS:
                raise BackendError(f"vkGetQueryPoolResults: VkResult {r}")
            for i in range(len(dispatches)):
                dt = (data[2 * i + 1] - data[2 * i]) * backend.ctx.timestamp_period * 1e-9
                best[i] = min(best[i], dt)
    finally:
        vk.vkDestroyQueryPool(dev, pool, None)
    return [(node.name, d.kernel.name, t) for (node, d), t in zip(dispatches, best)]
