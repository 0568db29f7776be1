"""Recording compute work: the Dispatch an op records at resize, a segment's Record (its ring of recorded
command buffers and its host copies), and the commands every recorder uses (bind, record, barrier)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import vulkan as vk

from aiomnn import copies

from .program import CONV_REG_LOCAL
from .queue import Submission

if TYPE_CHECKING:
    from .memory import Loc

ffi, lib = vk.ffi, vk.lib

COMPUTE = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
TRANSFER = vk.VK_PIPELINE_STAGE_TRANSFER_BIT
HOST = vk.VK_PIPELINE_STAGE_HOST_BIT
SHADER_RW = vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
TRANSFER_RW = vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT


class Dispatch:
    """One recorded compute dispatch."""

    __slots__ = ("kernel", "locs", "push", "groups", "set")

    def __init__(self, kernel, locs: list[Loc], push: bytes, groups: tuple[int, int, int]):
        self.kernel, self.locs, self.push, self.groups = kernel, locs, push, groups
        self.set = None


class Slot:
    """One recorded command buffer of a segment, and where its outputs land on the host (name, host view).

    A slot with a readback of its own (`handover`) lends its outputs to the caller as they are (the
    queue's _finish), and is not used again until every array of that run is gone (`lent`). `sends`
    holds, per large input, the untracked submissions that copy its pieces to the device, each with the
    end of its byte range (Queue.start sends each once the host has filled it). A `light` slot's outputs are
    never copied in pieces on the copy threads, so the event loop may complete its runs (Queue.submit)."""

    __slots__ = ("sub", "downloads", "handover", "sends", "lent", "light")

    def __init__(self, sub: Submission, downloads: list, handover: bool, sends: dict[str, list]):
        self.sub, self.downloads, self.handover, self.sends, self.lent = sub, downloads, handover, sends, False
        self.light = not any(copies.large(view.nbytes) for _, view in downloads)

    @property
    def pending(self) -> bool:
        return self.sub.pending

    def returned(self) -> None:
        self.lent = False


class Record:
    """A segment's recorded command buffers (a ring of slots, grown only while each is still pending or lent)
    and its host copies."""

    __slots__ = ("slots", "uploads", "pops", "make", "key", "upload_bytes", "provisional")

    def __init__(self, make, uploads, pops, key, provisional: bool = False):
        self.make = make  # records one more slot for this segment
        self.slots: list[Slot] = [make()]
        self.uploads = uploads  # (name, host view, shape)
        self.pops = pops  # host values whose last use is in this segment (known once a run brings the segment)
        self.key = key
        self.upload_bytes = sum(view.nbytes for _, view, _ in uploads)
        #: Recorded with casts of its inputs on the device while the host's rounding to half floats compiled.
        self.provisional = provisional

    @staticmethod
    def key_of(exes: list, uploads: list[str], downloads: list[str]) -> tuple:
        return tuple(id(e) for e in exes), tuple(uploads), tuple(downloads)

    def slot(self) -> Slot:
        for s in self.slots:
            if not s.pending and not s.lent:
                return s
        s = self.make()
        self.slots.append(s)
        return s


def bind(cmd, kernel, descriptor_set, push: bytes, pipeline: bool = True) -> None:
    """Bind a kernel's pipeline (unless `pipeline` is False: it is bound already), a descriptor set and the
    push constants (none for a specialized kernel: its pipeline holds them)."""
    if pipeline:
        vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline)
    lib.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout, 0, 1,
                                ffi.new("VkDescriptorSet[1]", [descriptor_set]), 0, ffi.NULL)
    if not kernel.specialized:
        lib.vkCmdPushConstants(cmd, kernel.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(push),
                               ffi.from_buffer(push))


#: The bindings each kernel writes (all others it only reads); binding 0, the output, for kernels not named.
WRITES = {"conv_gemm": (0, 4, 5), "conv_narrow": (0, 4, 5), "cast": (0, 1), **dict.fromkeys(CONV_REG_LOCAL, (0, 4, 5))}


def waves(dispatches: list[Dispatch]) -> list[list[Dispatch]]:
    """The dispatches in waves, in order, a barrier to go between two waves: each dispatch joins the wave
    after the last one holding a dispatch it must follow, one whose memory its own touches where either
    writes (the arena reuses memory, so a dispatch may have to wait for another to have read). Weights are
    never written and are left out.

    With a barrier after every dispatch, a model of many small dispatches spends most of its GPU time in the
    barriers: each waits for the slowest dispatch before it. The barrier's kind does not matter: a global
    memory barrier, buffer barriers and an execution-only one measured alike.
    Branches that do not depend on each other (detection heads, the pieces of a Concat) share waves.
    """
    seen: dict[tuple, list[tuple[int, int, bool, int]]] = {}  # memory -> (start, end, written, wave)
    out: list[list[Dispatch]] = []
    for d in dispatches:
        writes = WRITES.get(d.kernel.name, (0,))
        spans = [((loc.region, id(loc.buffer)), loc.offset, loc.offset + max(loc.nbytes, 1), i in writes)
                 for i, loc in enumerate(d.locs) if loc.region != "static"]
        wave = 0
        for key, a, b, w in spans:
            for a2, b2, w2, wave2 in seen.get(key, ()):
                if wave2 >= wave and (w or w2) and a < b2 and a2 < b:
                    wave = wave2 + 1
        if wave == len(out):
            out.append([])
        out[wave].append(d)
        for key, a, b, w in spans:
            seen.setdefault(key, []).append((a, b, w, wave))
    return out


def record(cmd, dispatches: list[Dispatch]) -> None:
    """Record dispatches in waves (see waves), a barrier after each wave that makes its writes visible to
    the next."""
    bound = None
    for wave in waves(dispatches):
        for d in wave:
            k = d.kernel
            bind(cmd, k, d.set, d.push, pipeline=k.pipeline is not bound)
            bound = k.pipeline
            lib.vkCmdDispatch(cmd, *d.groups)
        barrier(cmd, COMPUTE, COMPUTE, vk.VK_ACCESS_SHADER_WRITE_BIT, SHADER_RW)


def record_timed(cmd, dispatches: list[Dispatch], pool) -> None:
    """Record dispatches one after another (a barrier after each), for profiling: timestamp i + 1, written once
    dispatch i and all before it are done, ends its time; timestamp 0 starts the first's. The pool holds
    len(dispatches) + 1 timestamps."""
    n = len(dispatches) + 1
    vk.vkCmdResetQueryPool(cmd, pool, 0, n)
    lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 0)
    for i, d in enumerate(dispatches):
        bind(cmd, d.kernel, d.set, d.push)
        lib.vkCmdDispatch(cmd, *d.groups)
        barrier(cmd, COMPUTE, COMPUTE, vk.VK_ACCESS_SHADER_WRITE_BIT, SHADER_RW)
        lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, i + 1)


def barrier(cmd, src_stage: int, dst_stage: int, src_access: int, dst_access: int) -> None:
    mb = ffi.new("VkMemoryBarrier*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, "srcAccessMask": src_access,
                                      "dstAccessMask": dst_access})
    lib.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, mb, 0, ffi.NULL, 0, ffi.NULL)
