"""The Vulkan backend: the pipeline's hooks, each handed to the plan of the current shapes (plan.py) or the queue.

Resize (the pipeline's alloc):
  on_create     picks an op's shader plan, or declines (None: the CPU runs it).
  on_resize_begin  frees the last Plan and makes a new one; finds the fused groups (fusion.py) and the Concat
                and Split pieces that can share a block (Plan.plan_places).
  acquire_tensor  activations get arena offsets; Reshape-like ops alias their input (Plan).
  on_resize     each execution fixes its dispatches in the plan: kernel, bindings (Locs), push constants and
                grid (ops/base.py).
  on_resize_end creates the arena, io and aux buffers, one descriptor pool sized to the plan, and writes every
                descriptor set (buffers.py); then records the segments the plan will most likely have.
  The first submit of a segment not recorded then records its command buffer (segments.py): input copies, the
  dispatches in waves with a barrier between waves (record.waves), output copies, and its VkSubmitInfo.

Run (submit): copy the segment's host inputs into mapped memory (device memory
where the host can map it; else host memory, a large input in pieces, each sent
to the device as soon as it is filled), one vkQueueSubmit, and
return an aiomnn Fence. The queue's waiter thread sees the completion, puts the
outputs into the values dict and signals the fence (Queue.start). Where outputs are staged
through host memory the device imported, the arrays are that memory, handed to
the caller (memory.HandedOver); elsewhere they are copied. Inputs of OFFLOAD_BYTES or more
are copied and submitted on the runtime's submit thread instead, so the event loop
never spends milliseconds in memcpy.

With fp16 storage (precision="low") the host still reads and writes float32:
inputs go to a float32 staging area and outputs come back in one, and cast
dispatches recorded in the segment's command buffer convert on the device
(numpy's float16 conversion costs a few nanoseconds an element, tens of
milliseconds for a batch of images).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import vulkan as vk

from aiomnn.backend import Backend, Execution, Tensor
from aiomnn.config import ForwardType
from aiomnn.fence import Fence, offload
from aiomnn.graph import Node
from aiomnn.memory import Block
from aiomnn.offered import Offered

from ..cpu import halves
from . import buffers, ops, segments
from .fusion import plan_fusions
from .plan import Plan
from .record import Record

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .runtime import VulkanRuntime

#: Inputs of at least this many bytes are copied on the submit thread, so that the event loop does not wait
#: for a large memcpy; smaller ones on the caller's, which saves the hand-off and made runs quicker.
OFFLOAD_BYTES = 2 << 20

#: Activation memory reuses the range freed longest ago (Arena's `oldest`), not the smallest that fits: a block
#: in a range a dispatch has just read must wait for it, one wave more (record.waves). The real models get fewer
#: waves for a slightly larger arena; on a GPU a barrier itself costs little, what a wave costs is its slowest
#: dispatch. Taking fresh memory instead of reusing any cuts waves further but pushes activations out of the L2
#: cache. memory="low" or a memory_limit keep plain best fit, the smallest arena.


class VulkanBackend(Backend):
    type = ForwardType.VULKAN
    reads_consts = False

    def __init__(self, runtime: "VulkanRuntime", config, dry: bool = False):
        super().__init__(runtime, config)
        self.dry = dry  # plans launches only (for tuning): no weight uploads, no device memory
        self.ctx = runtime.ctx
        self.queue = runtime.queue
        self.looks = config.power != "low"  # the event loop may poll this backend's runs (queue.py)
        self.fp16 = config.precision == "low" and self.ctx.storage16
        self.align = max(64, self.ctx.min_offset_align)
        self.oldest = config.memory != "low" and config.memory_limit is None  # Arena's reuse rule
        # The fusion plan (fusion.plan_fusions) reads who makes and who reads each value from the ops offered.
        self.offered = Offered()
        self._new_plan()

    def _new_plan(self) -> None:
        self.plan = Plan(self.runtime, self.fp16, self.align, self.oldest, self.dry)
        self.arena = self.plan.arena  # the pipeline reads the arena's size here

    # Creation -----------------------------------------------------------------------
    def on_create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution | None:
        exe = ops.create(self, node, inputs, outputs)
        self.offered.add(node, exe, inputs, outputs)
        return exe

    # Memory -------------------------------------------------------------------------
    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        return self.plan.acquire_tensor(tensor, execution)

    def release(self, block: Block) -> None:
        self.plan.release(block)

    # Lifecycle ----------------------------------------------------------------------
    def clear_buffers(self) -> None:
        """Free everything planned for the current shapes (the weights stay in the runtime's pool)."""
        self.plan.free()
        self._new_plan()

    def on_resize_begin(self) -> None:
        self.clear_buffers()
        created = self.offered.take()
        plan_fusions(self.plan, created)
        self.plan.plan_places(created)

    def on_resize_end(self) -> None:
        try:
            buffers.allocate(self.plan)
            if not self.dry:
                segments.predict(self.plan, self.profile is not None)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as exc:
            raise MemoryError(f"Vulkan: {type(exc).__name__}") from None

    # Running ------------------------------------------------------------------------
    def record_of(self, segment: "Segment") -> Record:
        """The segment's recorded command buffers, recorded now if they were not yet."""
        plan = self.plan
        rec = plan.records.get(segment)
        if rec is not None and halves.settled(rec):  # the inputs go as half floats now (its old slots stay unused)
            rec = None
        if rec is None:
            rec = plan.records[segment] = segments.record(plan, segment, self.profile is not None)
        return rec

    def submit(self, segment: "Segment", values: dict[str, Any], device: bool = False) -> Fence:
        fence = Fence()
        try:
            rec = self.record_of(segment)
            stamps = self.plan.timestamps if self.profile is not None else None
            if rec.upload_bytes >= OFFLOAD_BYTES:
                offload(self.runtime.submitter, self.queue.start, rec, values, fence, stamps, self.looks)
            else:
                self.queue.start(rec, values, fence, stamps, self.looks)
        except BaseException as exc:
            fence.signal(error=exc)
        return fence

    # Profiling ----------------------------------------------------------------------
    def profile_segment(self, segment: "Segment", began_ns: int, ended_ns: int) -> None:
        assert self.profile is not None
        self.plan.timestamps.events(self.profile, segment, began_ns, ended_ns)
