"""The device memory a Vulkan backend's plan is made of, once planning is done (on_resize_end): the arena, the
io buffers (and their staging mirror), the aux tables, and every dispatch's descriptor set, which binds them;
and freeing all of it, with the plan's command buffers, before the next plan (clear_buffers).

backend.py plans where each tensor lives (memory.Loc); this module makes and frees what those places are in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import vulkan as vk

from aiomnn.errors import BackendError

from .memory import Loc, upload
from .record import Dispatch

if TYPE_CHECKING:
    from .backend import VulkanBackend

ffi, lib = vk.ffi, vk.lib


def buffer_of(be: "VulkanBackend", loc: Loc):
    """The buffer a place lies in: the plan's arena, io or aux buffer, or a buffer of its own (static, host)."""
    if loc.region == "arena":
        return be._arena_buf
    if loc.region == "io":
        return be._io_dev
    if loc.region == "aux":
        return be._aux_buf
    return loc.buffer


def host_view(be: "VulkanBackend", loc: Loc, shape: tuple[int, ...]) -> np.ndarray:
    """A value in the arena or io buffer as an array on its mapping (the buffer must be host-visible)."""
    buf = {"arena": be._arena_buf, "io": be._io_dev}[loc.region]
    return buf.view(loc.offset, be.store, shape)


def allocate(be: "VulkanBackend") -> None:
    """Make the plan's buffers (the arena, the io buffers with their staging mirror where the host cannot map
    device memory, the aux tables, uploaded now) and give every dispatch its descriptor set."""
    ctx = be.ctx
    if be.arena.size:
        be._arena_buf = ctx.device_buffer(be.arena.size)
    if be._io_size:  # device memory the host writes inputs into, or device memory and a staging mirror
        be._io_host = ctx.input_buffer(be._io_size)
        be._io_dev = be._io_host if ctx.direct_inputs else ctx.device_buffer(be._io_size)
    if be._aux:
        be._aux_buf = ctx.device_buffer(be._aux_size)
        data = np.zeros(be._aux_size, np.uint8)
        for loc, raw in be._aux:
            data[loc.offset: loc.offset + len(raw)] = np.frombuffer(raw, np.uint8)
        upload(ctx, be.queue, be._aux_buf, 0, data)
    write_descriptors(be, [d for e in be._exes for d in e.dispatches])


def write_descriptors(be: "VulkanBackend", dispatches: list[Dispatch]) -> None:
    """Give each dispatch its descriptor set, from a pool sized for exactly these."""
    if not dispatches:
        return
    dev = be.ctx.device
    total = sum(d.kernel.nbind for d in dispatches)
    size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=total)
    pool = vk.vkCreateDescriptorPool(dev, vk.VkDescriptorPoolCreateInfo(
        maxSets=len(dispatches), poolSizeCount=1, pPoolSizes=[size]), None)
    be._desc_pools.append(pool)
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
            buf = buffer_of(be, loc)
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


def free(be: "VulkanBackend") -> None:
    """Free the device memory, command buffers and descriptor pools of the current plan, waiting for its last
    run; where the device is gone (and everything made on it), only drop them."""
    if be.rt.closed:  # the device is gone, and everything made on it
        be._subs, be._cmds, be._records, be._desc_pools = [], [], {}, []
        be.timestamps.clear(destroy=False)
        be._arena_buf = be._io_dev = be._io_host = be._aux_buf = None
        be._extra_bufs = []
        return
    if be._last_value:
        be.queue.wait_value(be._last_value)
    for s in be._subs:
        s.destroy()
    be._subs = []
    be.ctx.free_command_buffers(be._cmds)
    be._cmds = []
    be._records = {}
    be._predicted = {}
    for pool in be._desc_pools:
        vk.vkDestroyDescriptorPool(be.ctx.device, pool, None)
    be._desc_pools = []
    be.timestamps.clear()
    for b in (be._arena_buf, be._io_dev, be._io_host, be._aux_buf, *be._extra_bufs):
        if b is not None:
            b.destroy()
    be._arena_buf = be._io_dev = be._io_host = be._aux_buf = None
    be._extra_bufs = []
