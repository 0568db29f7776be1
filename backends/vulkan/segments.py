"""A Vulkan plan's segments as recorded command buffers (backend.py calls these).

predict   at resize, records the segments the plan will most likely have (the
          pipeline's own are seen only at the first run).
record    a segment's Record: the prediction when it matches, else recorded now.

A Record's command buffer copies the inputs in where the device has memory of
its own that the host cannot map (large inputs in pieces submitted ahead of it),
or casts them from float32 with fp16 storage (unless the host writes them as half
floats into mapped device memory: cpu/halves.py), runs the dispatches in waves
(record.waves), and copies the outputs out to a readback area the host reads:
the record's own, or, where host memory can be imported, each slot's own, whose
arrays go to the caller.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np
import vulkan as vk

from aiomnn import copies
from aiomnn.errors import BackendError

from ..cpu import halves
from .buffers import buffer_of, host_view, write_descriptors
from .memory import Loc, align_up
from .queue import Submission
from .record import (COMPUTE, HOST, SHADER_RW, TRANSFER, TRANSFER_RW, Dispatch, Record, Slot, barrier,
                     record as record_cmds, record_timed)

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .plan import Plan
    from .device import Buffer

F32 = np.dtype(np.float32)
CAST_LOCAL = 256
#: Outputs of fewer bytes in all are copied out of the record's readback rather than handed over: lending
#: them (an array over foreign memory and a finalizer that frees the slot) costs more than copying them.
HANDOVER_BYTES = 64 << 10


def predict(plan: "Plan", profiling: bool) -> None:
    """Record, at resize, the segments this plan will most likely have.

    The backend does not see the pipeline's segments (consecutive steps on one backend)
    until the first run, so it predicts them: its executions in order, split before one that
    reads a host value no earlier execution read (one the CPU made in between, most likely;
    graph inputs are usually read first). A run checks that its segment is the one predicted
    (same executions, inputs and outputs); if not, that segment is recorded then.
    """
    groups: list[list] = []
    seen: set[str] = set()
    for exe in plan.exes:
        fresh = [n for n in exe.in_names if n in plan.host_inputs and n not in seen]
        if not groups or (fresh and any(groups)):
            groups.append([])
        seen.update(fresh)
        groups[-1].append(exe)
    for exes in groups:
        made = {o for e in exes for o in e.out_names}
        needs = list(dict.fromkeys(n for e in exes for n in e.in_names if n not in made))
        uploads = [n for n in needs if n in plan.host_inputs]
        downloads = [o for e in exes for o in e.out_names if plan.locs[o].region == "io"]
        rec = _build(plan, exes, uploads, downloads, None, profiling)
        plan.predicted[rec.key] = rec


def record(plan: "Plan", seg: "Segment", profiling: bool) -> Record:
    """The segment's Record: the one predicted at resize where it matches, else recorded now."""
    freed = {x for fr in seg.frees for x in fr}
    exes = [s.execution for s in seg.steps]
    uploads = [n for n in seg.needs if n in plan.host_inputs]
    made = [o for s in seg.steps for o in s.outputs if o]
    downloads = [n for n in made if n not in freed and n in plan.locs]
    pops = [x for x in seg.needs if x in freed]
    key = Record.key_of(exes, uploads, downloads)
    rec = plan.predicted.pop(key, None)
    if rec is not None:
        rec.pops = pops
        plan.predicted_hits += 1
        return rec
    return _build(plan, exes, uploads, downloads, pops, profiling)


def _build(plan: "Plan", exes: list, upload_names: list[str], download_names: list[str], pops: list[str] | None,
           profiling: bool) -> Record:
    lost = [n for n in download_names if n in plan.fused_away]
    if lost:  # a reader this backend never saw (fusion checks every reader it was offered)
        raise BackendError(f"values {lost} were fused away but are read outside the Vulkan segment")
    uploads = [(n, *plan.host_inputs[n]) for n in upload_names]
    downloads = [(n, plan.locs[n], plan.shapes[n]) for n in download_names]
    dispatches = [d for e in exes for d in e.dispatches]
    staged_in = not plan.ctx.direct_inputs  # the device copies inputs in from host memory
    staged = not plan.ctx.unified  # the device copies outputs out to host memory
    cast_in: list[Dispatch] = []
    cast_out: list[Dispatch] = []
    # fp16: the host writes half floats where the shaders read them, or float32 for casts on the device
    direct_halves = plan.fp16 and bool(uploads) and plan.ctx.direct_inputs
    rounded = direct_halves and halves.ready()
    provisional = direct_halves and not rounded and halves.pending()
    if plan.fp16 and uploads and not rounded:
        size, offsets = _host_layout(plan, [shape for *_, shape in uploads])
        stage = plan.ctx.input_buffer(size)
        plan.extra_bufs.append(stage)
        up_views = [(n, stage.view(off, F32, shape), shape) for (n, _, shape), off in zip(uploads, offsets)]
        cast_in = [_cast(plan, loc, stage, off, shape, to_f32=False)
                   for (_, loc, shape), off in zip(uploads, offsets)]
    else:
        up_views = [(n, plan.io_host.view(loc.offset, plan.store, shape), shape) for n, loc, shape in uploads]
    # Large inputs go to the device in pieces, each sent as soon as the host has filled it (Slot.sends).
    in_pieces = {n: copies.pieces(loc.nbytes, plan.store.itemsize) for n, loc, _ in uploads
                 if staged_in and not cast_in and copies.sent_in_pieces(loc.nbytes)}
    readback, rb_offsets, rb_size, down_views = None, [], 0, []
    if (staged or plan.fp16) and downloads:
        rb_size, rb_offsets = _host_layout(plan, [shape for *_, shape in downloads])
    # Outputs that land in host memory (staged, or cast to float32 from fp16 storage) land in memory each slot
    # imports, handed to the caller as they are; small ones are copied out of one readback instead (HANDOVER_BYTES).
    # fp16's casts once wrote into the one readback, and every run's outputs were copied out of it: 8.5 MB (rec at
    # batch 8) took as long as the run on the H200 (benchmarks/RESULTS.md, session 30).
    handover = bool(rb_size) and bool(plan.ctx.import_align) and rb_size >= HANDOVER_BYTES
    if rb_size and not handover:
        readback = plan.ctx.host_buffer(rb_size, readback=True)
        plan.extra_bufs.append(readback)
        down_views = _views(readback, downloads, rb_offsets)
        if plan.fp16:
            cast_out = _casts_out(plan, downloads, readback, rb_offsets)
            readback = None  # the casts fill it: nothing to copy
    elif not rb_size:
        down_views = [(n, host_view(plan, loc, shape)) for n, loc, shape in downloads]
    write_descriptors(plan, cast_in + cast_out)

    def make() -> Slot:
        rb, views, casts = readback, down_views, cast_out  # the record's, or with handover this slot's own
        if handover:
            rb = plan.ctx.import_host(rb_size)
            plan.extra_bufs.append(rb)
            views = _views(rb, downloads, rb_offsets)
            if plan.fp16:
                casts = _casts_out(plan, downloads, rb, rb_offsets)
                write_descriptors(plan, casts)
                rb = None  # the casts fill it
        sends = {n: [(b, _piece(plan, loc.offset + a, b - a)) for a, b in in_pieces[n]]
                 for n, loc, _ in uploads if n in in_pieces}
        cmd = plan.ctx.command_buffers(1)[0]
        plan.cmds.append(cmd)
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
        # Earlier submissions' writes (other segments, other runs, this run's input pieces) become visible here.
        everything = SHADER_RW | TRANSFER_RW
        barrier(cmd, COMPUTE | TRANSFER, COMPUTE | TRANSFER, everything, everything)
        whole = [loc for n, loc, _ in uploads if n not in in_pieces]
        if cast_in:
            record_cmds(cmd, cast_in)
        elif staged_in and whole:
            regions = [vk.VkBufferCopy(srcOffset=loc.offset, dstOffset=loc.offset, size=max(loc.nbytes, 1))
                       for loc in whole]
            vk.vkCmdCopyBuffer(cmd, plan.io_host.handle, plan.io_dev.handle, len(regions), regions)
            barrier(cmd, TRANSFER, COMPUTE, vk.VK_ACCESS_TRANSFER_WRITE_BIT, SHADER_RW)
        timed = profiling and plan.ctx.timestamps and bool(dispatches)
        if timed:  # profiling: each dispatch on its own, timed (record_timed)
            pool = plan.timestamps.pool(len(dispatches) + 1)
            record_timed(cmd, dispatches, pool)
            record_cmds(cmd, casts)
        else:
            record_cmds(cmd, dispatches + casts)
        if rb is not None:
            barrier(cmd, COMPUTE, TRANSFER, vk.VK_ACCESS_SHADER_WRITE_BIT, vk.VK_ACCESS_TRANSFER_READ_BIT)
            for (_, loc, _), off in zip(downloads, rb_offsets):
                region = vk.VkBufferCopy(srcOffset=loc.offset, dstOffset=off, size=max(loc.nbytes, 1))
                vk.vkCmdCopyBuffer(cmd, buffer_of(plan, loc).handle, rb.handle, 1, [region])
            barrier(cmd, TRANSFER, HOST, vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        else:
            barrier(cmd, COMPUTE, HOST, vk.VK_ACCESS_SHADER_WRITE_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        vk.vkEndCommandBuffer(cmd)
        sub = Submission(plan.queue, cmd)
        plan.subs.append(sub)
        if timed:
            plan.timestamps.add(sub, pool, len(dispatches) + 1)
        return Slot(sub, views, handover, sends)

    return Record(make, up_views, pops, Record.key_of(exes, upload_names, download_names), provisional)


def _piece(plan: "Plan", offset: int, nbytes: int) -> Submission:
    """An untracked submission copying bytes [offset, offset + nbytes) of the inputs' staging to the device."""
    cmd = plan.ctx.command_buffers(1)[0]
    plan.cmds.append(cmd)
    vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo())
    region = vk.VkBufferCopy(srcOffset=offset, dstOffset=offset, size=nbytes)
    vk.vkCmdCopyBuffer(cmd, plan.io_host.handle, plan.io_dev.handle, 1, [region])
    vk.vkEndCommandBuffer(cmd)
    sub = Submission(plan.queue, cmd, tracked=False)
    plan.subs.append(sub)
    return sub


def _host_layout(plan: "Plan", shapes: list[tuple[int, ...]]) -> tuple[int, list[int]]:
    """The size of a host area holding a float32 tensor of each shape, and their offsets in it."""
    size, offsets = 0, []
    for shape in shapes:
        off = align_up(size, plan.align)
        offsets.append(off)
        size = off + max(int(np.prod(shape, dtype=np.int64)) * F32.itemsize, 1)
    return size, offsets


def _views(buf: "Buffer", downloads: list, offsets: list[int]) -> list[tuple[str, np.ndarray]]:
    return [(n, buf.view(off, F32, shape)) for (n, _, shape), off in zip(downloads, offsets)]


def _casts_out(plan: "Plan", downloads: list, host: "Buffer", offsets: list[int]) -> list[Dispatch]:
    """The dispatches that write each fp16 output into `host` as float32, at its offset."""
    return [_cast(plan, loc, host, off, shape, to_f32=True) for (_, loc, shape), off in zip(downloads, offsets)]


def _cast(plan: "Plan", dev: Loc, host: "Buffer", offset: int, shape: tuple[int, ...], to_f32: bool) -> Dispatch:
    """A dispatch converting a device tensor from (or to) float32 at `offset` of a host buffer."""
    n = int(np.prod(shape, dtype=np.int64))
    k = plan.programs.kernel("cast", True, (CAST_LOCAL, 1, 1), (int(to_f32),))
    groups = (max(1, min(-(-n // CAST_LOCAL), plan.ctx.max_groups[0], 65535)), 1, 1)
    return Dispatch(k, [dev, Loc("host", offset, n * F32.itemsize, host)], struct.pack("<i", n), groups)

