"""The device memory a Vulkan plan is made of, once planning is done (on_resize_end): the arena, the io buffers
(and their staging mirror), the aux tables, and every dispatch's descriptor set, which binds them; and freeing
all of it, with the plan's command buffers, before the next plan (Plan.free).

plan.py plans where each tensor lives (memory.Loc); this module makes and frees what those places are in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import vulkan as vk

from aiomnn.errors import BackendError

from .memory import Loc, upload
from .record import Dispatch

if TYPE_CHECKING:
    from .plan import Plan

ffi, lib = vk.ffi, vk.lib


def buffer_of(plan: "Plan", loc: Loc):
    """The buffer a place lies in: the plan's arena, io or aux buffer, or a buffer of its own (static, host)."""
    if loc.region == "arena":
        return plan.arena_buf
    if loc.region == "io":
        return plan.io_dev
    if loc.region == "aux":
        return plan.aux_buf
    return loc.buffer


def host_view(plan: "Plan", loc: Loc, shape: tuple[int, ...]) -> np.ndarray:
    """A value in the arena or io buffer as an array on its mapping (the buffer must be host-visible)."""
    buf = {"arena": plan.arena_buf, "io": plan.io_dev}[loc.region]
    return buf.view(loc.offset, plan.store, shape)


def allocate(plan: "Plan") -> None:
    """Make the plan's buffers (the arena, the io buffers with their staging mirror where the host cannot map
    device memory, the aux tables, uploaded now) and give every dispatch its descriptor set."""
    ctx = plan.ctx
    if plan.arena.size:
        plan.arena_buf = ctx.device_buffer(plan.arena.size)
    if plan.io_size:  # device memory the host writes inputs into, or device memory and a staging mirror
        plan.io_host = ctx.input_buffer(plan.io_size)
        plan.io_dev = plan.io_host if ctx.direct_inputs else ctx.device_buffer(plan.io_size)
    if plan.aux_tables:
        plan.aux_buf = ctx.device_buffer(plan.aux_size)
        data = np.zeros(plan.aux_size, np.uint8)
        for loc, raw in plan.aux_tables:
            data[loc.offset: loc.offset + len(raw)] = np.frombuffer(raw, np.uint8)
        upload(ctx, plan.queue, plan.aux_buf, 0, data)
    write_descriptors(plan, [d for e in plan.exes for d in e.dispatches])


def write_descriptors(plan: "Plan", dispatches: list[Dispatch]) -> None:
    """Give each dispatch its descriptor set, from a pool sized for exactly these."""
    if not dispatches:
        return
    dev = plan.ctx.device
    total = sum(d.kernel.nbind for d in dispatches)
    size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=total)
    pool = vk.vkCreateDescriptorPool(dev, vk.VkDescriptorPoolCreateInfo(
        maxSets=len(dispatches), poolSizeCount=1, pPoolSizes=[size]), None)
    plan.desc_pools.append(pool)
    sets = vk.vkAllocateDescriptorSets(dev, vk.VkDescriptorSetAllocateInfo(
        descriptorPool=pool, descriptorSetCount=len(dispatches),
        pSetLayouts=[d.kernel.set_layout for d in dispatches]))
    # Raw structures: the wrappers cost tens of microseconds per struct.
    infos = ffi.new("VkDescriptorBufferInfo[]", total)
    writes = ffi.new("VkWriteDescriptorSet[]", total)
    k = 0
    for i, d in enumerate(dispatches):
        d.set = sets[i]
        for j, loc in enumerate(d.locs):
            buf = buffer_of(plan, loc)
            if buf is None:
                raise BackendError(f"no device buffer for {loc}")
            infos[k].buffer = buf.handle
            infos[k].offset = loc.offset
            infos[k].range = max(loc.nbytes, 4)
            w = writes[k]
            w.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
            w.dstSet = d.set
            w.dstBinding = j
            w.descriptorCount = 1
            w.descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
            w.pBufferInfo = infos + k
            k += 1
    lib.vkUpdateDescriptorSets(dev, total, writes, 0, ffi.NULL)


def free(plan: "Plan") -> None:
    """Free the device memory, command buffers and descriptor pools of a plan, waiting for its last
    run; where the device is gone (and everything made on it), only drop them."""
    if plan.runtime.closed:  # the device is gone, and everything made on it
        plan.subs, plan.cmds, plan.records, plan.desc_pools = [], [], {}, []
        plan.timestamps.clear(destroy=False)
        plan.arena_buf = plan.io_dev = plan.io_host = plan.aux_buf = None
        plan.extra_bufs = []
        return
    last = max((s.value for s in plan.subs), default=0)  # the value of this plan's last submission
    if last:
        plan.queue.wait_value(last)
    for s in plan.subs:
        s.destroy()
    plan.subs = []
    plan.ctx.free_command_buffers(plan.cmds)
    plan.cmds = []
    plan.records = {}
    plan.predicted = {}
    for pool in plan.desc_pools:
        vk.vkDestroyDescriptorPool(plan.ctx.device, pool, None)
    plan.desc_pools = []
    plan.timestamps.clear()
    for b in (plan.arena_buf, plan.io_dev, plan.io_host, plan.aux_buf, *plan.extra_bufs):
        if b is not None:
            b.destroy()
    plan.arena_buf = plan.io_dev = plan.io_host = plan.aux_buf = None
    plan.extra_bufs = []
