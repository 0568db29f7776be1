"""A CUDA backend's plan for one resize (one shape of the model): its steps, where each value lives, and the
device memory, views and runs that binding.py makes of it. A new Plan is made when a resize begins
(backend.on_resize_begin) and dropped as a whole when the next begins or the buffers are cleared; ops read it
when they bind, as do binding.py, runs.py and grouping.py.

In the order of a resize:
  Plan(...)       the steps the backend created, indexed: who makes and who reads each value, and which run
                  (consecutive CUDA steps, one segment) each step is in.
  begin           which elementwise chains may fuse (grouping.py) and how long their inputs must then live, and
                  which Concat and Split pieces share one block so that no copy is needed (aiomnn/places.py).
  acquire_tensor / release / op_resized
                  the pipeline's arena planning: a fused value gets no memory, a value a fused kernel reads
                  later lives until that kernel runs (the memory group of methods below).
  binding.bind    the arena and the other buffers, views, bound ops and recorded runs (on_resize_end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cupy
import numpy as np

from aiomnn import places
from aiomnn.backend import Execution, Tensor
from aiomnn.errors import BackendError
from aiomnn.graph import Node
from aiomnn.memory import Arena, Block, SharedArena

from . import attention, grouping
from .ops.base import CudaOp
from .ops.tensor import Concat, Split

if TYPE_CHECKING:
    from .runs import Run
    from .runtime import CudaRuntime

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


@dataclass(eq=False)
class Step:
    index: int
    node: Node
    exe: CudaOp | None  # None: the backup runs it
    ins: list[str]
    outs: list[str]


def dev_dtype(dtype: np.dtype, half: bool) -> np.dtype:
    """The dtype a value is stored in on the device: float32 as fp16 with half (precision="low")."""
    return (F16 if half else F32) if np.dtype(dtype) == F32 else np.dtype(dtype)


class Plan:
    """Everything one resize of a CUDA backend planned. `derived` is the backend's (constants its ops computed
    from constants, which outlive a plan), `arena` the backend's arena for this resize. Nothing here refers
    back to the backend (its acquire comes with each call), so a plan adds no reference cycle to it."""

    def __init__(self, rt: CudaRuntime, half: bool, stream: Any, derived: dict[str, np.ndarray], arena: Arena,
                 steps: list[Step], tensors: dict[str, Tensor]):
        self.rt, self.half, self.stream, self.derived, self.arena = rt, half, stream, derived, arena
        self.shared = SharedArena(arena)
        # The steps, and who makes and reads each value.
        self.steps = steps
        self.tensors = tensors
        self.producer: dict[str, int] = {}
        self.readers: dict[str, set[int]] = {}
        self.last_use: dict[str, int] = {}
        self.run_of: dict[int, int] = {}
        # Attention chains that run as one kernel (attention.py), by their last step.
        self.attention: dict[int, Any] = {}
        # Memory planning (the memory group of methods).
        self.extend: dict[str, int] = {}
        self.no_memory: set[str] = set()
        self.acquired: set[str] = set()
        self.kept: set[str] = set()
        self.block_of: dict[str, Block] = {}  # each value's block in the arena (one inside another's, shared)
        self.name_of: dict[int, str] = {}  # id(block) -> its value
        self.place: dict[str, tuple[str, int]] = {}  # value -> (class, byte offset in the class's block)
        self.class_size: dict[str, int] = {}
        self.class_block: dict[str, Block] = {}
        self.scratch_blocks: dict[int, Block] = {}
        # Binding (binding.py): device memory, views, fusion, runs.
        self.arena_mem = None
        self.separate: dict[str, Any] = {}
        self.views: dict[str, Any] = {}
        self.workspace_mem = None
        self.roots: dict[int, Any] = {}
        self.absorbed: dict[int, int] = {}
        self.runs: dict[int, Run] = {}
        self.keep: list[Any] = []
        self.summary: dict[str, Any] = {}
        self._index_steps()

    def _index_steps(self) -> None:
        run = -1
        prev_mine = False
        for s in self.steps:
            for x in s.ins:
                if x:
                    self.readers.setdefault(x, set()).add(s.index)
                    self.last_use[x] = s.index
            for o in s.outs:
                if o:
                    self.producer[o] = s.index
            if s.exe is not None:
                if not prev_mine:
                    run += 1
                self.run_of[s.index] = run
                s.exe.step = s.index
            prev_mine = s.exe is not None

    def begin(self) -> None:
        """What resize plans before memory: the fusion candidates (their inputs live as long as a consumer
        may read them, and a value computed inside its consumer gets no memory), and the shared places."""

        def extend(name: str, j: int) -> bool:
            if self.extend.get(name, -1) < j:
                self.extend[name] = j
            return True

        self.attention = attention.find(self)
        for ch in self.attention.values():
            self.no_memory.update(ch.inner)  # the scores and probabilities never leave the kernel
            for name in ch.reads:
                extend(name, ch.final)
        _, absorbed = grouping.fuse(self, set(), extend)
        for i in absorbed:
            exe = self.steps[i].exe
            if exe.consumer:  # computed inside its consumer; never stored
                self.no_memory.add(exe.out_names[0])
        self._plan_places()

    def dev_dtype(self, dtype: np.dtype) -> np.dtype:
        return dev_dtype(dtype, self.half)

    def in_attention(self) -> set[int]:
        """The steps of the attention chains (fusion leaves them alone: each chain is one kernel)."""
        return {j for ch in self.attention.values() for j in ch.steps}

    def dev_nbytes(self, t: Tensor) -> int | None:
        if t.shape is None or t.dtype is None or t.dtype == object:
            return None
        return int(np.prod(t.shape, dtype=np.int64)) * self.dev_dtype(t.dtype).itemsize

    def alive(self, name: str, j: int) -> bool:
        """Whether a value can still be read at step j (what fusion asks before a kernel reads it there)."""
        if name in self.derived or name in self.kept:
            return True
        t = self.tensors.get(name)
        if t is not None and t.is_const:
            return True
        if name not in self.block_of:
            # A separate buffer lives through the run; a value planned as fused that stays
            # stored after all gets a separate buffer at binding.
            return True
        return self.last_use.get(name, -1) >= j or self.extend.get(name, -1) >= j

    # Memory: arena blocks, places shared by Concat and Split pieces and by aliases, deferred releases --------
    def _plan_places(self) -> None:
        """Concat and Split pieces that share one block, so that no copy is needed (aiomnn/places.py)."""

        def stored(name: str) -> bool:
            i = self.producer.get(name)
            return (i is not None and self.steps[i].exe is not None and name not in self.no_memory
                    and bool(self.dev_nbytes(self.tensors[name])))

        joins = []
        for s in self.steps:
            exe = s.exe
            if isinstance(exe, Concat):
                joins.append((exe.out_names[0], exe.out_shape, exe.ins, exe.axis, False))
            elif isinstance(exe, Split):
                joins.append((exe.in_names[0], exe.in_shape(0), exe.outs, exe.axis, True))
        self.place, self.class_size = places.plan(
            joins, stored, lambda name: self.dev_nbytes(self.tensors[name]),
            lambda name: self.dev_dtype(self.tensors[name].dtype).itemsize)

    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        """A value's block (None: no memory): inside a block it shares (a Concat's or Split's class, the input of
        an alias) or one of its own."""
        name = tensor.name
        self.acquired.add(name)
        if name in self.no_memory or not isinstance(execution, CudaOp):
            return None
        n = self.dev_nbytes(tensor)
        if n is None:
            return None
        shared, block = self.shared, None
        if name in self.place:
            cls, offset = self.place[name]
            root = self.class_block.get(cls)
            if root is None:
                root = self.class_block[cls] = shared.acquire(self.class_size[cls], users=0)
            if shared.owns(root):  # else released already: a member the pipeline kept out of the arena (a graph
                block = shared.within(root, n, offset)  # output) left a gap; this one is on its own, copied
        elif execution.alias and name == execution.out_names[0]:
            src = self.block_of.get(execution.in_names[0])
            if src is not None and shared.owns(src) and src.size >= n:
                block = shared.within(src, n)
        if block is None:
            block = shared.acquire(n)
        self.block_of[name] = block
        self.name_of[id(block)] = name
        return block

    def release(self, block: Block) -> None:
        name = self.name_of.get(id(block))
        self.shared.release(block, until=self.extend.get(name, -1) if name is not None else -1)

    def op_resized(self, exe: CudaOp) -> None:
        """An op's on_resize: note graph outputs, plan scratch, free what fused kernels no longer need."""
        exe.resized = True
        for o in exe.out_names:
            if o and o not in self.acquired:
                self.kept.add(o)  # the pipeline keeps graph outputs out of the arena
        n = exe.scratch_bytes()
        if n:
            blk = self.arena.acquire(n)
            self.scratch_blocks[id(exe)] = blk
            self.arena.release(blk)
        self.shared.placed(exe.step)  # after the scratch: a value freed now may still be read at this step

    # Device arrays, once bound (binding.py) ---------------------------------------------------------------
    def view(self, name: str) -> "cupy.ndarray":
        """The device array holding a value (a const is uploaded on first use)."""
        v = self.views.get(name)
        if v is not None:
            return v
        if name in self.derived:
            arr = self.derived[name]
            v = self.rt.upload(arr, self.dev_dtype(arr.dtype))
            self.keep.append(arr)
        else:
            t = self.tensors.get(name)
            if t is None or not t.is_const:
                raise BackendError(f"cuda: value {name!r} has no device memory")
            arr = np.asarray(t.const)
            v = self.rt.upload(arr, self.dev_dtype(arr.dtype))
        self.views[name] = v
        return v

    def workspace(self, dtype: np.dtype, count: int) -> "cupy.ndarray":
        """The plan's workspace: ops run one after another on one stream, so they share it."""
        return cupy.ndarray((count,), dtype=dtype, memptr=self.workspace_mem)

    def scratch(self, exe: CudaOp, dtype: np.dtype, count: int) -> "cupy.ndarray":
        """An op's scratch, planned in the arena (op_resized)."""
        blk = self.scratch_blocks[id(exe)]
        return cupy.ndarray((count,), dtype=dtype, memptr=self.arena_mem + blk.offset)
