"""Recording compute work: the Dispatch an op records at resize, a segment's Record (its ring of recorded
command buffers and its host copies), and the commands every recorder uses (bind, record, barrier)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import vulkan as vk

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


class Record:
    """A segment's recorded command buffers (a ring, grown only if one is still pending) and its host copies."""

    __slots__ = ("slots", "uploads", "downloads", "pops", "make", "key", "upload_bytes")

    def __init__(self, make, uploads, downloads, pops, key):
        self.make = make  # records one more command buffer for this segment
        self.slots: list[Submission] = [make()]
        self.uploads = uploads  # (name, host view, shape)
        self.downloads = downloads  # (name, host view)
        self.pops = pops  # host values whose last use is in this segment (known once a run brings the segment)
        self.key = key
        self.upload_bytes = sum(view.nbytes for _, view, _ in uploads)

    @staticmethod
    def key_of(exes: list, uploads: list[str], downloads: list[str]) -> tuple:
        return tuple(id(e) for e in exes), tuple(uploads), tuple(downloads)

    def slot(self) -> Submission:
        for s in self.slots:
            if not s.pending:
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


def record(cmd, dispatches: list[Dispatch]) -> None:
    """Record dispatches, each followed by a barrier that makes its writes visible to the next."""
    bound = None
    for d in dispatches:
        k = d.kernel
        bind(cmd, k, d.set, d.push, pipeline=k.pipeline is not bound)
        bound = k.pipeline
        lib.vkCmdDispatch(cmd, *d.groups)
        barrier(cmd, COMPUTE, COMPUTE, vk.VK_ACCESS_SHADER_WRITE_BIT, SHADER_RW)


def barrier(cmd, src_stage: int, dst_stage: int, src_access: int, dst_access: int) -> None:
    mb = ffi.new("VkMemoryBarrier*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, "srcAccessMask": src_access,
                                      "dstAccessMask": dst_access})
    lib.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, mb, 0, ffi.NULL, 0, ffi.NULL)
