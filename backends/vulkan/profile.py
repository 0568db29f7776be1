"""Device time of Vulkan dispatches, from timestamp queries.

* Timestamps: a session's profile (ScheduleConfig(profile=True)). The segments recorded with profiling on
  write a timestamp between their dispatches; after a run, each op (or fused group) becomes one event.
* profile(): every dispatch of one segment, best of a few runs, for tools (which kernels dominate a
  model) and for comparing shader changes; not for serving: it blocks until the device is done.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import vulkan as vk

from aiomnn.errors import BackendError
from aiomnn.profile import OpEvent, Profile

from ..cpu import halves
from .record import COMPUTE, SHADER_RW, TRANSFER, TRANSFER_RW, barrier, bind

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .backend import VulkanBackend
    from .queue import Submission
    from .record import Slot

ffi, lib = vk.ffi, vk.lib


class Timestamps:
    """A plan's timed command buffers: each one's query pool and timestamp count, and the slot last submitted."""

    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.pools: dict["Submission", tuple[Any, int]] = {}
        self.last: "Slot | None" = None

    def pool(self, n: int) -> Any:
        """A pool of n timestamp queries, to register with add() once its command buffer exists."""
        return vk.vkCreateQueryPool(self.ctx.device, vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                                                                             queryCount=n), None)

    def add(self, sub: "Submission", pool: Any, n: int) -> None:
        self.pools[sub] = (pool, n)

    def clear(self, destroy: bool = True) -> None:
        """Forget the plan's pools; destroy them unless the device is gone with them."""
        if destroy:
            for pool, _ in self.pools.values():
                vk.vkDestroyQueryPool(self.ctx.device, pool, None)
        self.pools, self.last = {}, None

    def events(self, profile: Profile, segment: "Segment", began_ns: int, ended_ns: int) -> None:
        """One event per op (or fused group) that recorded dispatches: their device time, from the timestamps
        the last submitted slot's command buffer wrote, placed from the segment's start on the host. Without
        timestamps on the device's queue, one event for the segment, on the host's clock."""
        slot, self.last = self.last, None
        found = self.pools.get(slot.sub) if slot is not None else None
        if found is None:
            name, op_type, args = profile.describe([s.node for s in segment.steps])
            profile.add(OpEvent(name, op_type, "vulkan", began_ns, ended_ns - began_ns,
                                {**args, "clock": "host", "per_op": "not available: the device's queue "
                                 "has no timestamp queries; this is the whole segment"}))
            return
        pool, n = found
        data = ffi.new("uint64_t[]", n)
        r = lib.vkGetQueryPoolResults(self.ctx.device, pool, 0, n, 8 * n, data, 8,
                                      vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        if r != vk.VK_SUCCESS:
            raise BackendError(f"vkGetQueryPoolResults: VkResult {r}")
        period = self.ctx.timestamp_period  # ns a tick
        i = 0
        for s in segment.steps:
            exe = s.execution
            k = len(exe.dispatches)
            if not k:
                continue
            group = getattr(exe, "group", None)
            fused = group is not None and group.members[-1] is exe and all(not m.dispatches for m in group.members[:-1])
            name, op_type, args = profile.describe([m.node for m in group.members] if fused else [s.node])
            start, dur = (data[i] - data[0]) * period, (data[i + k] - data[i]) * period
            i += k
            profile.add(OpEvent(name, op_type, "vulkan", began_ns + int(start), int(dur),
                                {**args, "clock": "device", "kernels": [d.kernel.name for d in exe.dispatches]}))


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
        for _ in halves.fill(view, values[name]):
            pass
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
