"""A Vulkan backend's plan: everything that belongs to one resize (one shape of the model).

The backend makes a Plan when a resize begins and frees the old one as a whole (free: its device memory,
descriptor pools and command buffers, after its last run). Ops read and fill it at on_resize, buffers.py
makes its device memory at on_resize_end, segments.py records its command buffers:

  where values live   locs (memory.Loc by value), shapes, host_inputs (what a run copies in from the host),
                      io_size, aux_tables and aux_size (small tables made on the host)
  executions          exes, in order, each with its dispatches
  device memory       arena_buf, io_dev, io_host, aux_buf, extra_bufs, desc_pools (buffers.py)
  recorded commands   records (by segment), predicted (recorded at resize), cmds, subs, timestamps
  fusion              extend, fused_away, fused (fusion.py, groups.py)

and what they need of the runtime: the device (ctx), its queue, its programs (kernels), the storage type.
The arena planning with aliases (Reshape-like ops, Concat and Split pieces in one block, releases deferred for
fused groups) is the group of methods under "Memory".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from aiomnn import places
from aiomnn.backend import Execution, Tensor
from aiomnn.memory import Arena, Block, SharedArena, StorageType

from ..cpu import halves
from . import buffers
from .memory import Loc, align_up
from .profile import Timestamps

if TYPE_CHECKING:
    from .record import Record
    from .runtime import VulkanRuntime

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


class Plan:
    """One resize of one backend: made at on_resize_begin, filled by its ops, freed as a whole (free)."""

    def __init__(self, runtime: "VulkanRuntime", fp16: bool, align: int, oldest: bool, dry: bool = False):
        self.runtime = runtime
        self.ctx = runtime.ctx
        self.queue = runtime.queue
        self.programs = runtime.programs
        self.fp16 = fp16
        self.store = F16 if fp16 else F32
        self.align = align
        self.dry = dry  # launches only (for tuning): no weight uploads, no device memory
        if fp16 and self.ctx.direct_inputs and not dry:
            halves.ready()  # the host's rounding to half floats starts compiling, to be ready when segments record
        # Where each value lives.
        self.locs: dict[str, Loc] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.produced: set[str] = set()
        self.host_inputs: dict[str, tuple[Loc, tuple[int, ...]]] = {}
        self.io_size = 0
        self.aux_tables: list[tuple[Loc, bytes]] = []
        self.aux_size = 0
        self.exes: list = []
        # Device memory and recorded commands (buffers.py, segments.py).
        self.arena_buf = self.io_dev = self.io_host = self.aux_buf = None
        self.extra_bufs: list = []
        self.desc_pools: list = []
        self.cmds: list = []
        self.subs: list = []
        self.records: dict[Any, "Record"] = {}
        self.predicted: dict[tuple, "Record"] = {}
        self.predicted_hits = 0  # segments whose commands were recorded at resize (for tests)
        self.timestamps = Timestamps(self.ctx)  # the timed command buffers, with profiling on
        # Fusion: values whose memory must outlive their last reader (a fused group reads them at its last
        # step), the values no dispatch computes any more, and the kind of each group applied (for tests).
        self.extend: dict[str, int] = {}
        self.fused_away: set[str] = set()
        self.fused: list[str] = []
        # Memory (below): the arena, whose blocks views and Concat and Split pieces share.
        self.shared = SharedArena(Arena(align, oldest=oldest))
        self.arena = self.shared.arena
        self.mine: set[int] = set()  # ids of the arena blocks this plan handed out, views among them
        self.alias_loc: dict[int, Loc] = {}  # alias block -> an io Loc it shares
        self.block_name: dict[int, str] = {}
        # Concat and Split pieces that share one block (see plan_places): value -> (class, byte offset), the
        # bytes of each class, and the block of each class.
        self.place: dict[str, tuple[str, int]] = {}
        self.class_size: dict[str, int] = {}
        self.class_block: dict[str, Block] = {}

    def nbytes(self, t: Tensor) -> int:
        return int(np.prod(t.shape, dtype=np.int64)) * self.store.itemsize

    def free(self) -> None:
        """Free what this plan made on the device, after its last run."""
        buffers.free(self)

    # Where values live -----------------------------------------------------------------
    def locate_output(self, t: Tensor) -> Loc:
        self.produced.add(t.name)
        return self.locate(t)

    def locate(self, t: Tensor) -> Loc:
        """Where a tensor lives on the device, deciding it on first sight."""
        loc = self.locs.get(t.name)
        if loc is not None:
            return loc
        n = self.nbytes(t)
        if t.is_const and self.dry:
            loc = Loc("static", 0, n)
        elif t.is_const:
            loc = self.runtime.static.get(t.const, self.store)
        elif t.block is not None and id(t.block) in self.alias_loc:
            loc = self.alias_loc[id(t.block)]
        elif t.block is not None and id(t.block) in self.mine:
            loc = Loc("arena", t.block.offset, n)
        else:
            off = align_up(self.io_size, self.align)
            self.io_size = off + max(n, 1)
            loc = Loc("io", off, n)
            if t.name not in self.produced:
                self.host_inputs[t.name] = (loc, tuple(t.shape))
        self.locs[t.name] = loc
        self.shapes[t.name] = tuple(t.shape)
        return loc

    def aux(self, data: np.ndarray) -> Loc:
        """A small table made on the host for this plan (uploaded at on_resize_end)."""
        raw = np.ascontiguousarray(data).tobytes()
        off = align_up(self.aux_size, self.align)
        self.aux_size = off + max(len(raw), 4)
        loc = Loc("aux", off, len(raw))
        self.aux_tables.append((loc, raw))
        return loc

    # Memory: arena blocks, views, places, releases deferred for fused groups ---------------
    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        block = self._acquire_tensor(tensor, execution)
        if block is not None:
            self.block_name[id(block)] = tensor.name
        return block

    def _acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        if tensor.shape is None:
            return None
        shared = self.shared
        place = self.place.get(tensor.name)
        if place is not None:
            name, offset = place
            root = self.class_block.get(name)
            if root is None or not shared.owns(root):  # its first value (or all it held were freed: the
                # pieces left are copied); no value of its own, it goes with its last value
                root = self.class_block[name] = shared.acquire(self.class_size[name], users=0)
            return self._mine(shared.within(root, self.nbytes(tensor), offset))
        src = getattr(execution, "alias_of", None)
        if src is not None:
            loc = self.locate(src)
            if loc.region == "arena":
                return self._mine(shared.within(src.block, src.block.size))
            if loc.region == "io":
                block = Block(loc.nbytes, StorageType.DYNAMIC_SEPARATE, loc.offset)
                self.alias_loc[id(block)] = loc
                return block
        return self._mine(shared.acquire(max(self.nbytes(tensor), 1)))

    def _mine(self, block: Block) -> Block:
        self.mine.add(id(block))
        return block

    def release(self, block: Block) -> None:
        name = self.block_name.get(id(block))
        self.shared.release(block, until=self.extend.get(name, -1) if name is not None else -1)

    def advance(self, step: int) -> None:
        """Planning reached this step (of the created list), its outputs placed: free what fused groups no
        longer need."""
        self.shared.placed(step)

    def plan_places(self, created: list[tuple]) -> None:
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
        self.place = {n: p for n, p in place.items() if p[0] not in bad}
        self.class_size = {c: n for c, n in sizes.items() if c not in bad}
