"""The Vulkan backend: plans device memory, records command buffers, submits runs.

Resize (the pipeline's alloc):
  on_create     picks an op's shader plan, or declines (None: the CPU runs it).
  acquire_tensor  activations get arena offsets; Reshape-like ops alias their input.
  on_resize     each execution fixes its dispatches: kernel, bindings (Locs), push
                constants and grid.
  on_resize_end creates the arena, io and aux buffers, one descriptor pool sized to
                the plan, and writes every descriptor set (buffers.py).
  prepare_segments (or the first submit of a segment) records the segment's command
                buffer (segments.py): input copies, the dispatches in waves with a
                barrier between waves (record.waves), output copies, and its VkSubmitInfo.

Run (submit): copy the segment's host inputs into mapped memory (device memory
where the host can map it; else host memory, a large input in pieces, each sent
to the device as soon as it is filled), one vkQueueSubmit, and
return an aiomnn Fence. The queue's waiter thread sees the completion, puts the
outputs into the values dict and signals the fence. Where outputs are staged
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

import functools
import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import vulkan as vk

from aiomnn import copies, places
from aiomnn.backend import Backend, Execution, Tensor
from aiomnn.config import ForwardType
from aiomnn.errors import BackendError
from aiomnn.fence import Fence, offload
from aiomnn.graph import Node
from aiomnn.memory import Arena, Block, HandedOver, Lease, StorageType, handed

from .memory import Loc, align_up
from .profile import Timestamps
from .queue import Submission
from . import buffers, segments
from .record import Record, Slot

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .runtime import VulkanRuntime

log = logging.getLogger("aiomnn.vulkan")
ffi, lib = vk.ffi, vk.lib

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)

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
        self.rt = runtime
        self.ctx = runtime.ctx
        self.queue = runtime.queue
        self.fp16 = config.precision == "low" and self.ctx.storage16
        self.store = F16 if self.fp16 else F32
        self.align = max(64, self.ctx.min_offset_align)
        self.oldest = config.memory != "low" and config.memory_limit is None  # Arena's reuse rule
        self._last_value = 0
        self._records: dict[Any, Record] = {}
        self._cmds: list = []
        self._subs: list[Submission] = []
        self._arena_buf = self._io_dev = self._io_host = self._aux_buf = None
        self._extra_bufs: list = []
        self._desc_pools: list = []
        self.timestamps = Timestamps(self.ctx)  # the timed command buffers, with profiling on
        self.predicted_hits = 0  # segments whose commands were recorded at resize (for tests)
        # Every node this backend was offered in this alloc pass, in order: (node, execution or None, inputs,
        # outputs). The fusion plan (fusion.plan_fusions) reads who consumes each value from it.
        self._created: list[tuple] = []
        self._created_ids: set[int] = set()
        self._reset_plan()

    # Planning state -----------------------------------------------------------------
    def _reset_plan(self) -> None:
        self.arena = Arena(self.align, oldest=self.oldest)
        self.blocks = []
        self._mine: dict[int, Block] = {}  # arena blocks this backend handed out
        self._alias_root: dict[int, Block] = {}  # alias block -> the arena block it shares
        self._alias_loc: dict[int, Loc] = {}  # alias block -> an io Loc it shares
        self._refs: dict[int, int] = {}  # root block -> aliases still alive
        self._locs: dict[str, Loc] = {}
        self._produced: set[str] = set()
        self._host_inputs: dict[str, tuple[Loc, tuple[int, ...]]] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._io_size = 0
        self._aux: list[tuple[Loc, bytes]] = []
        self._aux_size = 0
        self._exes: list = []
        self._predicted: dict[tuple, Record] = {}
        # Fusion: values whose memory must outlive their last reader (a fused group reads them at its last
        # step), releases deferred until then, and the values no dispatch computes any more.
        self._extend: dict[str, int] = {}
        self._deferred: list[tuple[int, Block]] = []
        self._block_name: dict[int, str] = {}
        self._cursor = -1
        self._fused_away: set[str] = set()
        self.fused: list[str] = []  # the kind of each fused group that was applied (for tests)
        # Concat and Split pieces that share one block (see _plan_places): value -> (class, byte offset), the
        # bytes of each class, and the block of each class while any of its values lives.
        self._place: dict[str, tuple[str, int]] = {}
        self._class_size: dict[str, int] = {}
        self._class_block: dict[str, Block] = {}
        self._class_of: dict[int, str] = {}

    def nbytes(self, t: Tensor) -> int:
        return int(np.prod(t.shape, dtype=np.int64)) * self.store.itemsize

    # Creation -----------------------------------------------------------------------
    def on_create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution | None:
        from .ops import create

        if id(node) in self._created_ids:  # a new alloc pass started
            self._created, self._created_ids = [], set()
        self._created_ids.add(id(node))
        exe = create(self, node, inputs, outputs)
        if exe is not None:
            exe.step = len(self._created)
        self._created.append((node, exe, list(inputs), list(outputs)))
        return exe

    # Memory -------------------------------------------------------------------------
    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        block = self._acquire_tensor(tensor, execution)
        if block is not None:
            self._block_name[id(block)] = tensor.name
        return block

    def _acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        if tensor.shape is None:
            return None
        place = self._place.get(tensor.name)
        if place is not None:
            name, offset = place
            root = self._class_block.get(name)
            if root is None:  # its first value (or all it held were freed: the pieces left are copied)
                root = self._class_block[name] = self.acquire(self._class_size[name])
                self._mine[id(root)] = root
                self._class_of[id(root)] = name
                self._refs[id(root)] = -1  # no value of its own: freed with its last value
            return self._alias(root, self.nbytes(tensor), root.offset + offset)
        src = getattr(execution, "alias_of", None)
        if src is not None:
            loc = self.locate(src)
            if loc.region == "arena":
                root = self._alias_root.get(id(src.block), src.block)
                return self._alias(root, src.block.size, src.block.offset)
            if loc.region == "io":
                block = Block(loc.nbytes, StorageType.DYNAMIC_SEPARATE, loc.offset)
                self._alias_loc[id(block)] = loc
                return block
        block = self.acquire(max(self.nbytes(tensor), 1))
        self._mine[id(block)] = block
        return block

    def _alias(self, root: Block, size: int, offset: int) -> Block:
        """A block inside `root` that keeps it alive."""
        block = Block(size, StorageType.DYNAMIC, offset)
        self._alias_root[id(block)] = root
        self._refs[id(root)] = self._refs.get(id(root), 0) + 1
        return block

    def release(self, block: Block) -> None:
        name = self._block_name.get(id(block))
        target = self._extend.get(name, -1) if name is not None else -1
        if target > self._cursor:  # a fused group reads it later
            self._deferred.append((target, block))
            return
        self._release(block)

    def advance(self, step: int) -> None:
        """Planning reached this step (of the created list): free what fused groups no longer need."""
        self._cursor = max(self._cursor, step)
        keep = []
        for target, block in self._deferred:
            if target < step:
                self._release(block)
            else:
                keep.append((target, block))
        self._deferred = keep

    def _release(self, block: Block) -> None:
        if id(block) in self._alias_loc:
            return
        root = self._alias_root.pop(id(block), block)
        n = self._refs.get(id(root), 0)
        if n:
            self._refs[id(root)] = n - 1
            return
        if id(root) in self._mine:
            self.arena.release(root)
            self._class_block.pop(self._class_of.pop(id(root), ""), None)

    def locate_output(self, t: Tensor) -> Loc:
        self._produced.add(t.name)
        return self.locate(t)

    def locate(self, t: Tensor) -> Loc:
        """Where a tensor lives on the device, deciding it on first sight."""
        loc = self._locs.get(t.name)
        if loc is not None:
            return loc
        n = self.nbytes(t)
        if t.is_const and self.dry:
            loc = Loc("static", 0, n)
        elif t.is_const:
            loc = self.rt.static.get(t.const, self.store)
        elif t.block is not None and id(t.block) in self._alias_loc:
            loc = self._alias_loc[id(t.block)]
        elif t.block is not None and (id(t.block) in self._mine or id(t.block) in self._alias_root):
            loc = Loc("arena", t.block.offset, n)
        else:
            off = align_up(self._io_size, self.align)
            self._io_size = off + max(n, 1)
            loc = Loc("io", off, n)
            if t.name not in self._produced:
                self._host_inputs[t.name] = (loc, tuple(t.shape))
        self._locs[t.name] = loc
        self._shapes[t.name] = tuple(t.shape)
        return loc

    def aux(self, data: np.ndarray) -> Loc:
        """A small table made on the host for this plan (uploaded at on_resize_end)."""
        raw = np.ascontiguousarray(data).tobytes()
        off = align_up(self._aux_size, self.align)
        self._aux_size = off + max(len(raw), 4)
        loc = Loc("aux", off, len(raw))
        self._aux.append((loc, raw))
        return loc

    # Lifecycle ----------------------------------------------------------------------
    def clear_buffers(self) -> None:
        """Free everything planned for the current shapes (the weights stay in the runtime's pool)."""
        buffers.free(self)
        self._reset_plan()

    def on_resize_begin(self) -> None:
        from .fusion import plan_fusions

        self.clear_buffers()
        created, self._created, self._created_ids = self._created, [], set()
        plan_fusions(self, created)
        self._plan_places(created)

    def _plan_places(self, created: list[tuple]) -> None:
        """Concat and Split without copies: where each piece is one contiguous range of the whole (as at batch
        1), the producers of a Concat's inputs write into its output and a Split's outputs are views of its
        input (aiomnn/places.py plans it, as for CUDA); the ops skip the copies of pieces already in place."""
        from .ops.tensor import Concat, Split

        producer = {t.name: exe for _, exe, _, outs in created for t in outs if t is not None and t.name}
        inner = {x for _, exe, _, _ in created if exe is not None and exe.group is not None for x in exe.group.inner}
        nbytes = {t.name: self.nbytes(t) for _, _, ins, outs in created for t in [*ins, *outs]
                  if t is not None and t.name and t.shape is not None}

        def stored(name: str) -> bool:  # a dispatch of this backend writes it into the arena
            return producer.get(name) is not None and name not in inner and nbytes.get(name, 0) > 0

        joins = []
        for _, exe, ins, outs in created:
            if isinstance(exe, Concat):
                joins.append((outs[0].name, tuple(outs[0].shape), ins, exe.axis, False))
            elif isinstance(exe, Split):
                joins.append((ins[0].name, tuple(ins[0].shape), outs, exe.axis, True))
        if not joins:
            return
        place, sizes = places.plan(joins, stored, nbytes.__getitem__, lambda name: self.store.itemsize)
        # A binding's offset must be a multiple of the device's alignment: a class with a piece elsewhere is
        # dropped (its pieces get blocks of their own and are copied).
        bad = {c for c, off in place.values() if off % self.align}
        self._place = {n: p for n, p in place.items() if p[0] not in bad}
        self._class_size = {c: n for c, n in sizes.items() if c not in bad}

    def on_resize_end(self) -> None:
        try:
            buffers.allocate(self)
            if not self.dry:
                segments.predict(self)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as exc:
            raise MemoryError(f"Vulkan: {type(exc).__name__}") from None

    # Recording ----------------------------------------------------------------------
    def prepare_segments(self, segments: list["Segment"]) -> None:
        """Record every segment of this backend from the pipeline's own segments (exact; no prediction)."""
        for seg in segments:
            if seg.backend is self:
                self.record_of(seg)

    def record_of(self, segment: "Segment") -> Record:
        """The segment's recorded command buffers, recorded now if they were not yet."""
        rec = self._records.get(segment)
        if rec is None:
            rec = self._records[segment] = segments.record(self, segment)
        return rec

    # Running ------------------------------------------------------------------------
    def submit(self, segment: "Segment", values: dict[str, Any], device: bool = False) -> Fence:
        fence = Fence()
        try:
            rec = self.record_of(segment)
            if rec.upload_bytes >= OFFLOAD_BYTES:
                offload(self.rt.submitter, self._start, rec, values, fence)
            else:
                self._start(rec, values, fence)
        except BaseException as exc:
            fence.signal(error=exc)
        return fence

    def _start(self, rec: Record, values: dict[str, Any], fence: Fence) -> None:
        """Copy the inputs into mapped memory and submit; errors go to the fence."""
        try:
            slot = rec.slot()
            for name, view, shape in rec.uploads:
                v = values[name]
                if v.shape != shape:
                    raise BackendError(f"input {name!r} has shape {v.shape}, the plan has {shape}")
                sends = slot.sends.get(name, ())
                i = 0
                for _, filled in copies.fill(view, v):
                    while i < len(sends) and sends[i][0] <= filled:
                        self.queue.send(sends[i][1])
                        i += 1
            if self.profile is not None:
                self.timestamps.last = slot
            self._last_value = self.queue.submit(slot.sub, functools.partial(_finish, rec, slot, values, fence))
        except BaseException as exc:
            fence.signal(error=exc)

    # Profiling ----------------------------------------------------------------------
    def profile_segment(self, segment: "Segment", began_ns: int, ended_ns: int) -> None:
        assert self.profile is not None
        self.timestamps.events(self.profile, segment, began_ns, ended_ns)


def _finish(rec: Record, slot: Slot, values: dict[str, Any], fence: Fence, err: BaseException | None) -> None:
    """On the waiter thread: the segment completed; hand its outputs over (or copy them) and signal."""
    if err is not None:
        fence.signal(error=BackendError(f"the Vulkan run failed: {err}"))
        return
    try:
        lent = slot.handover and _lend(slot, values)
        for name, view in () if lent else slot.downloads:
            if copies.large(view.nbytes):
                values[name] = out = np.empty(view.shape, view.dtype)
                copies.copy(out, view)
            else:
                values[name] = view.copy()
        for name in rec.pops:
            values.pop(name, None)
    except BaseException as exc:
        fence.signal(error=exc)
        return
    fence.signal()


def _lend(slot: Slot, values: dict[str, Any]) -> bool:
    """Make the slot's outputs arrays on its own readback, as they are, within the bytes callers may hold
    (memory.handed); the slot is free again when they are all gone."""
    nbytes = sum(view.nbytes for _, view in slot.downloads)
    if not handed.take(nbytes):
        return False
    lease = Lease(slot, nbytes, slot.returned)
    for name, view in slot.downloads:
        values[name] = np.asarray(HandedOver(lease, view.ctypes.data, view.shape, view.dtype))
    slot.lent = True
    return True
