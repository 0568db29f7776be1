"""One resize of an OpenCL backend: where each tensor lives on the device, the ops' recorded kernels, and
what a run of each segment uploads, enqueues and reads back.

Memory. Activations produced here are offsets in one arena buffer planned by
the pipeline (DYNAMIC); a metadata-only op (Reshape, Squeeze...) aliases its
input, which then stays reserved until the alias is dead too. Where each piece
of a Concat or Split is one contiguous range of the whole (as at batch 1), the
producers of a Concat's inputs write into its output and a Split's outputs are
views of its input (`plan_places`, aiomnn/places.py); the op's copies of pieces
already in place are left out, so it may launch nothing. Graph outputs
and values that come from the host (graph inputs, results of CPU segments)
get their own buffers (DYNAMIC_SEPARATE). Weights and index tables are
uploaded once (STATIC) and handed from plan to plan.

Recording. Each op's kernels are built when it is planned, and their
arguments set in `finish`, once the plan's memory exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from aiomnn import places
from aiomnn.backend import Tensor
from aiomnn.errors import BackendError
from aiomnn.memory import Arena, Block, SharedArena, StorageType
from aiomnn.poll import Timing

from .ops.base import ClExecution, Const, In, Launch, OpContext, Out, Scratch
from .ops.layout import contiguous_copy
from .tune import cached_local_size, settle

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .runtime import OpenclRuntime


@dataclass(eq=False)
class SegmentPlan:
    """What a run of one segment does: the host values it writes, its kernels, the values it reads back (each
    with its block, tensor and dtype on the device), and the values it frees."""

    uploads: list[tuple[str, Block, Tensor, np.dtype]]
    launches: list[Launch]
    downloads: list[tuple[str, Block, Tensor, np.dtype]]
    frees: list[str]
    # The launches as one command buffer (driver.py), recorded by the queue at the first run; None where the
    # device records none.
    recorded: bool = False
    commands: Any = None
    timing: Timing = field(default_factory=Timing)  # how long its runs take, as the queue's waiter saw them


class Plan:
    """Everything an OpenCL backend holds for one set of input shapes; made when a resize begins, released as a
    whole (`release`) when the next one begins or the backend's buffers are cleared."""

    def __init__(self, runtime: "OpenclRuntime", ctx: OpContext, weights: dict[tuple, Block]):
        self.runtime = runtime
        self.ctx = ctx
        #: The weights the backend holds (shared through the runtime), handed from plan to plan; `finish` lets
        #: go of those this plan does not use (folded constants of older shapes).
        self.weights = weights
        self.weights_used: set[tuple] = set()
        self.shared = SharedArena(Arena(runtime.align))
        self.arena = self.shared.arena
        self.blocks: list[Block] = []  # the arena's blocks: each gets the arena buffer in finish
        self.arena_memory: cl.Buffer | None = None
        self.locations: dict[str, Block] = {}  # where each value lives on the device in this plan
        self.external: dict[str, tuple[Block, Tensor]] = {}  # values written from the host
        self.tensors: dict[str, Tensor] = {}  # values produced here
        self.separate: list[Block] = []
        self.aliases: list[tuple[Block, Block]] = []  # (alias, the block it lies in)
        self.recorded: list[ClExecution] = []
        self.segments: dict[int, SegmentPlan] = {}  # by id(Segment)
        # Fusion (fusion.py): values a fused group reads at its last step, after their last reader in the graph,
        # live until that step (name -> step); and the kind of each group applied (for tests).
        self.extend: dict[str, int] = {}
        self.fused: list[str] = []
        self.fused_away: set[str] = set()  # the inner values of the groups applied: no kernel computes them
        self._names: dict[int, str] = {}  # id(arena block) -> the value it holds
        # Concat and Split pieces that share one block (plan_places): value -> (class, byte offset), the bytes of
        # each class, and the arena block of each class while some value of it lives.
        self.place: dict[str, tuple[str, int]] = {}
        self.class_size: dict[str, int] = {}
        self.class_block: dict[str, Block] = {}

    # Memory: arena blocks and aliases of them (an arena block stays reserved while an alias of it lives) ----
    def acquire(self, tensor: Tensor, execution: ClExecution) -> Block:
        n = self.ctx.nbytes(tensor)
        if execution.alias is not None:
            src = self.input_location(execution.inputs[execution.alias])
            if self.shared.owns(src):
                block = self.shared.within(src, n)
            else:  # a host value's or a weight's buffer
                block = Block(n, src.storage, src.offset)
            self.aliases.append((block, src))
        elif tensor.name in self.place:
            block = self._placed(tensor.name, n)
        else:
            block = self.shared.acquire(n)
            self.blocks.append(block)
        self.locations[tensor.name] = block
        self._names[id(block)] = tensor.name
        return block

    def _placed(self, name: str, n: int) -> Block:
        """A placed value's block, in its class's (made with the class's first value, or again once every value
        that it held was released: the pieces that come later then lie elsewhere, and are copied)."""
        cls, offset = self.place[name]
        root = self.class_block.get(cls)
        if root is None or not self.shared.owns(root):
            root = self.class_block[cls] = self.shared.acquire(self.class_size[cls], users=0)
        block = self.shared.within(root, n, offset)
        self.blocks.append(block)
        return block

    def plan_places(self, created: list[tuple]) -> None:
        """Concat and Split without copies: the pieces of each whose copies are marked (Launch.piece: one
        contiguous range of the whole) share one block with it where aiomnn/places.py finds the values that
        kernels write do not overlap. Values no kernel here writes decline their op: graph inputs, constants,
        CPU results, aliases and the inner values of fused groups."""
        writes: set[str] = set()
        tensors = {t.name: t for _, _, ins, outs in created for t in [*ins, *outs] if t is not None and t.name}
        inner = {x for _, exe, _, _ in created if exe is not None and exe.group is not None for x in exe.group.inner}
        joins: list[places.Join] = []
        for node, exe, ins, outs in created:
            if exe is None:
                continue
            if exe.alias is None:
                writes.update(t.name for t in outs if t is not None and t.name and t.name not in inner)
            if node.domain or not exe.launches or any(l.piece is None for l in exe.launches):
                continue
            axis = node.attrs.get("axis", 1 if node.op_type == "Concat" else 0)
            if node.op_type == "Concat":
                joins.append((outs[0].name, tuple(outs[0].shape), ins, axis % len(outs[0].shape), False))
            elif node.op_type == "Split":
                joins.append((ins[0].name, tuple(ins[0].shape), outs, axis % len(ins[0].shape), True))
        if joins:
            self.place, self.class_size = places.plan(
                joins, writes.__contains__, lambda name: self.ctx.nbytes(tensors[name]),
                lambda name: self.ctx.storage(tensors[name].dtype).itemsize)

    def in_place(self, exe: ClExecution, launch: Launch) -> bool:
        """Whether a launch copies a Concat's or Split's piece (Launch.piece) that already lies where it belongs in
        the whole: both in the arena, the piece at its offset in the whole's range."""
        if launch.piece is None:
            return False
        piece, whole, offset = launch.piece
        a, b = exe.locations[(type(piece), piece.index)], exe.locations[(type(whole), whole.index)]
        return a.storage is b.storage is StorageType.DYNAMIC and a.offset == b.offset + offset

    def release_block(self, block: Block) -> None:
        name = self._names.get(id(block))
        self.shared.release(block, until=self.extend.get(name, -1) if name is not None else -1)

    def advance(self, step: int) -> None:
        """Planning reached this step (of the backend's list of ops), its outputs placed: free the values that
        fused groups read up to it."""
        self.shared.placed(step)

    def in_arena(self, name: str) -> bool:
        """Whether a value produced here lives in the arena (not in a buffer of its own, as graph outputs do)."""
        block = self.locations.get(name)
        return block is not None and block.storage is StorageType.DYNAMIC

    def separate_block(self, name: str, t: Tensor) -> Block:
        block = Block(self.ctx.nbytes(t), StorageType.DYNAMIC_SEPARATE)
        self.separate.append(block)
        self.locations[name] = block
        return block

    def input_location(self, t: Tensor) -> Block:
        if t.is_const:
            arr = np.asarray(t.const)
            dtype = self.ctx.storage(arr.dtype)
            return self.weight(("value", t.name, id(t.const), dtype.str),
                               Const(("value", t.name), lambda: arr, floats=True))
        block = self.locations.get(t.name)
        if block is None:  # it comes from the host: a graph input or a CPU segment's result
            block = self.separate_block(t.name, t)
            self.external[t.name] = (block, t)
        return block

    def weight(self, key: tuple, const: Const) -> Block:
        key = key + (self.ctx.float_type,)
        self.weights_used.add(key)
        block = self.weights.get(key)
        if block is None:
            block = self.runtime.static(key, const, self.ctx)
            self.weights[key] = block
        return block

    def release(self) -> None:
        """Give the plan's buffers back to the runtime's pool."""
        pool = self.runtime.pool
        if self.arena_memory is not None:
            pool.release(self.arena_memory)
            self.arena_memory = None
        for b in self.separate:
            if b.memory is not None:
                pool.release(b.memory)

    # Recording -----------------------------------------------------------------------------------
    def record(self, exe: ClExecution, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        """on_resize of one op: decide where its tensors live, build its kernels."""
        if exe.alias is not None and (not outputs[0].name or outputs[0].block is None):
            exe.launches, exe.alias = [contiguous_copy(self.ctx, exe.inputs[exe.alias], outputs[0])], None
        for i, t in enumerate(inputs):
            if t is not None and t.name:
                exe.locations[(In, i)] = self.input_location(t)
        for i, t in enumerate(outputs):
            if t.name:
                block = self.locations.get(t.name)
                if block is None:
                    block = self.separate_block(t.name, t)
                exe.locations[(Out, i)] = block
                self.tensors[t.name] = t
        exe.launches = [l for l in exe.launches if not self.in_place(exe, l)]
        runtime = self.runtime
        for launch in exe.launches:
            for a in launch.args:
                if isinstance(a, Scratch):  # lives for this op only; later tensors may reuse it
                    block = self.arena.acquire(a.nbytes)
                    self.blocks.append(block)
                    exe.locations[(Scratch, id(a))] = block
                    self.arena.release(block)
                elif isinstance(a, Const):
                    exe.locations[(Const, id(a))] = self.weight(a.key, a)
            run = settle(runtime, self.ctx, launch)  # with tiles, the kernel and tile chosen (tiles.py)
            program = runtime.programs.build(run.program, self.ctx.options + run.options)
            launch.cl_kernel = cl.Kernel(program, run.kernel)
            lws = run.local
            if run.tune and lws is None:
                lws = cached_local_size(runtime, runtime.tuner, self.ctx, run)
            launch.lws = lws or runtime.default_local(run.size)
            launch.gws = runtime.global_size(run.size, launch.lws)
            launch.enqueue = runtime.queue.launcher(launch.cl_kernel, launch.gws, launch.lws)
        self.recorded.append(exe)

    def finish(self) -> None:
        """The plan is final: give every block its buffer and set every kernel's arguments."""
        pool = self.runtime.pool
        if self.arena.size:
            self.arena_memory = pool.acquire(self.arena.size)
        for b in self.blocks:
            b.memory = self.arena_memory
        for b in self.separate:
            b.memory = pool.acquire(b.size)
        for alias, root in self.aliases:
            alias.memory = root.memory
        for exe in self.recorded:
            for launch in exe.launches:
                self._bind(exe, launch)
        if self.recorded:  # let go of weights no op of this plan uses (folded constants of older shapes)
            for key in [k for k in self.weights if k not in self.weights_used]:
                del self.weights[key]

    def _bind(self, exe: ClExecution, launch: Launch) -> None:
        args: list[Any] = []
        for a in launch.args:
            if isinstance(a, (In, Out)):
                t = (exe.inputs if isinstance(a, In) else exe.outputs)[a.index]
                block = exe.locations[(type(a), a.index)]
                args += [block.memory, np.int32(block.offset // self.ctx.storage(t.dtype).itemsize)]
            elif isinstance(a, Const):
                args += [exe.locations[(Const, id(a))].memory, np.int32(0)]
            elif isinstance(a, Scratch):
                block = exe.locations[(Scratch, id(a))]
                args += [block.memory, np.int32(block.offset // a.itemsize)]
            else:
                args.append(a)
        try:
            launch.cl_kernel.set_args(*args)
        except cl.Error as exc:
            raise BackendError(f"{exe.node}: cannot set the arguments of {launch.kernel}: {exc}") from None

    # Running ----------------------------------------------------------------------------------------
    def segment(self, segment: "Segment") -> SegmentPlan:
        """What a run of this segment does, worked out at its first run."""
        found = self.segments.get(id(segment))
        if found is not None:
            return found
        freed = {x for f in segment.frees for x in f}
        uploads = []
        for x in segment.needs:
            if x in self.external:
                block, t = self.external[x]
                uploads.append((x, block, t, self.ctx.storage(t.dtype)))
        launches = [l for s in segment.steps for l in s.execution.launches]
        downloads = []
        for s in segment.steps:
            for o in s.outputs:
                if o and o not in freed and o in self.tensors:
                    t = self.tensors[o]
                    downloads.append((o, self.locations[o], t, self.ctx.storage(t.dtype)))
        lost = [d[0] for d in downloads if d[0] in self.fused_away]
        if lost:  # a reader this backend was never offered: the fusion plan could not know of it
            raise BackendError(f"values {lost} were fused away but are read outside the OpenCL segment")
        found = SegmentPlan(uploads, launches, list(dict.fromkeys(downloads)), sorted(freed))
        self.segments[id(segment)] = found
        return found
