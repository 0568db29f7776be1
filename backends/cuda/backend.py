"""The CUDA backend: plan, fuse, bind, record a CUDA graph per segment at resize; launch and await at run.

Resize, in the pipeline's order:
  on_create        every runtime node passes here first (CUDA is the main backend), so the backend sees the
                   whole step list and which steps the backup runs.
  on_resize_begin  plans which elementwise chains fuse (grouping.py: candidates) and how long their inputs must
                   live, and which Concat and Split pieces share one block so that no copy is needed
                   (aiomnn/places.py).
  acquire_tensor / on_resize / release
                   the pipeline's arena planning; a fused value gets no memory, a value a fused kernel reads
                   later lives until that kernel runs.
  on_resize_end    the final fusion (graph outputs are known now), the arena and staging buffers, kernel
                   compilation and binding, one eager warm-up, then stream capture of each segment into a CUDA
                   graph (binding.py).

A run (submit): runs.py copies the inputs to the device, launches the graph (every kernel), copies each output
into a pinned block of cupy's pool that becomes the caller's array (no host copy after the run:
memory.HandedOver), and completes the Fence when the stream reaches its end (see WAIT_MODES).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import cupy
import numpy as np

from aiomnn import geometry, places
from aiomnn.backend import Backend, Execution, Tensor, all_empty
from aiomnn.config import ForwardType
from aiomnn.errors import BackendError
from aiomnn.fence import Fence
from aiomnn.graph import Node
from aiomnn.memory import Block, StorageType

from . import binding, grouping, runs
from .ops import OPS, Raster
from .ops.base import CudaOp, Decline
from .ops.tensor import Concat, Split
from .runs import Run
from .waiter import Waiter

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .runtime import CudaRuntime

log = logging.getLogger("aiomnn")

#: Threads a block of the generated elementwise kernels (launcher's default).
BLOCK = 256

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)

#: How a run's completion reaches the event loop (AIOMNN_CUDA_WAIT):
#: "thread" (default): a waiter thread per backend (waiter.py) sleeps until shortly before the
#:     run is expected to finish, polls its event, falls back to cudaEventSynchronize on a
#:     blocking-sync event, then signals the Fence;
#: "hostfunc": cudaLaunchHostFunc after the run's copies signals the Fence from a driver thread.
#: The waiter thread woke the awaiting task sooner than a host function, under uvloop and
#: asyncio alike, and it does not hold the stream while a driver thread waits for the GIL.
WAIT_MODES = ("thread", "hostfunc")

@dataclass(eq=False)
class Step:
    index: int
    node: Node
    exe: CudaOp | None  # None: the backup runs it
    ins: list[str]
    outs: list[str]


class CudaBackend(Backend):
    type = ForwardType.CUDA
    reads_consts = False
    reads_device_arrays = True

    def __init__(self, runtime: CudaRuntime, config):
        super().__init__(runtime, config)
        self.rt = runtime
        self.half = config.precision == "low"
        self.t_dtype = F16 if self.half else F32
        with runtime.device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.wait_mode = os.environ.get("AIOMNN_CUDA_WAIT", "thread")
        if self.wait_mode not in WAIT_MODES:
            raise BackendError(f"AIOMNN_CUDA_WAIT must be one of {WAIT_MODES}, not {self.wait_mode!r}")
        self._created: list[Step] = []
        self._created_nodes: set[int] = set()
        self._tensors_pending: dict[str, Tensor] = {}
        self._derived: dict[str, np.ndarray] = {}
        self._waiter: Waiter | None = None
        self._events: list = []  # blocking-sync events the waiter is done with, to record again
        self._blas = None
        # The tuner plans its candidates first and records each when it times it (tune.py): the
        # candidates' kernels compile side by side meanwhile.
        self.record_at_resize = True
        self._reset_plan()

    def _reset_plan(self) -> None:
        self._steps: list[Step] = []
        self._producer: dict[str, int] = {}
        self._readers: dict[str, set[int]] = {}
        self._last_use: dict[str, int] = {}
        self._run_of: dict[int, int] = {}
        self._tensors: dict[str, Tensor] = {}
        self._extend: dict[str, int] = {}
        self._no_memory: set[str] = set()
        self._acquired: set[str] = set()
        self._kept: set[str] = set()
        self._block_of: dict[str, Block] = {}
        self._offset: dict[str, int] = {}  # a value's byte offset in its block (a class member's)
        self._place: dict[str, tuple[str, int]] = {}  # value -> (class, byte offset in the class's block)
        self._class_size: dict[str, int] = {}
        self._class_block: dict[str, Block] = {}
        self._names_of: dict[int, list[str]] = {}
        self._deferred: dict[int, list[Block]] = {}
        self._cursor = -1
        self._scratch: dict[int, Block] = {}
        self._arena_mem = None
        self._separate: dict[str, Any] = {}
        self._views: dict[str, Any] = {}
        self._workspace = None
        self._roots: dict[int, Any] = {}
        self._absorbed: dict[int, int] = {}
        self._runs: dict[int, Run] = {}
        self._keep: list[Any] = []
        self.summary: dict[str, Any] = {}

    # Creation ---------------------------------------------------------------
    def on_create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution | None:
        if id(node) in self._created_nodes:  # a new alloc pass started
            self._created, self._created_nodes, self._tensors_pending = [], set(), {}
        self._created_nodes.add(id(node))
        exe = None
        # The op's class first (some alias, or lie in place); then, for data movement, the raster (ops/raster.py).
        if node.domain == "" and not all_empty(outputs):  # empty outputs: the backup's
            for impl in filter(None, [OPS.lookup(node), Raster if node.op_type in geometry.OPS else None]):
                try:
                    exe = impl(self, node, list(inputs), list(outputs))
                    break
                except Decline as exc:
                    log.debug("cuda declines %s: %s", node, exc)
                except Exception as exc:  # a case the op did not foresee: the backup runs it
                    log.warning("cuda declines %s after %s: %s", node, type(exc).__name__, exc)
        step = Step(len(self._created), node, exe, [t.name if t is not None else "" for t in inputs],
                    [t.name for t in outputs])
        for t in list(inputs) + list(outputs):
            if t is not None and t.name:
                self._tensors_pending[t.name] = t
        self._created.append(step)
        return exe

    def derived(self, node: Node, tag: str, value: np.ndarray) -> str:
        """Register a constant computed from a node's constants; returns its value name."""
        name = f"{node.name or id(node)}::{tag}"
        self._derived[name] = value
        return name

    def dev_dtype(self, dtype: np.dtype) -> np.dtype:
        return self.t_dtype if np.dtype(dtype) == F32 else np.dtype(dtype)

    # Fusion plan ------------------------------------------------------------
    def _index_steps(self) -> None:
        self._steps = self._created
        self._tensors = self._tensors_pending
        self._created, self._created_nodes, self._tensors_pending = [], set(), {}
        run = -1
        prev_mine = False
        for s in self._steps:
            for x in s.ins:
                if x:
                    self._readers.setdefault(x, set()).add(s.index)
                    self._last_use[x] = s.index
            for o in s.outs:
                if o:
                    self._producer[o] = s.index
            if s.exe is not None:
                if not prev_mine:
                    run += 1
                self._run_of[s.index] = run
                s.exe.step = s.index
            prev_mine = s.exe is not None

    # Memory planning (called by the pipeline) --------------------------------
    def on_resize_begin(self) -> None:
        self.clear_buffers()
        self._index_steps()

        def extend(name: str, j: int) -> bool:
            if self._extend.get(name, -1) < j:
                self._extend[name] = j
            return True

        _, absorbed = grouping.plan(self, set(), extend)
        for i in absorbed:
            exe = self._steps[i].exe
            if exe.consumer:  # computed inside its consumer; never stored
                self._no_memory.add(exe.out_names[0])
        self._plan_places()

    def _plan_places(self) -> None:
        """Concat and Split pieces that share one block, so that no copy is needed (aiomnn/places.py)."""

        def stored(name: str) -> bool:
            i = self._producer.get(name)
            return (i is not None and self._steps[i].exe is not None and name not in self._no_memory
                    and bool(self._dev_nbytes(self._tensors[name])))

        joins = []
        for s in self._steps:
            exe = s.exe
            if isinstance(exe, Concat):
                joins.append((exe.out_names[0], exe.out_shape, exe.ins, exe.axis, False))
            elif isinstance(exe, Split):
                joins.append((exe.in_names[0], exe.in_shape(0), exe.outs, exe.axis, True))
        self._place, self._class_size = places.plan(
            joins, stored, lambda name: self._dev_nbytes(self._tensors[name]),
            lambda name: self.dev_dtype(self._tensors[name].dtype).itemsize)

    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        name = tensor.name
        self._acquired.add(name)
        if name in self._no_memory or not isinstance(execution, CudaOp):
            return None
        n = self._dev_nbytes(tensor)
        if n is None:
            return None
        shared, offset = None, 0
        if name in self._place:
            root, offset = self._place[name]
            shared = self._class_block.get(root)
            if shared is None:
                shared = self._class_block[root] = self.acquire(self._class_size[root])
                shared.refs = 0
                self._names_of[id(shared)] = []
            elif not shared.refs:  # released already: a member the pipeline kept out of the arena
                shared = None  # (a graph output) left a gap; this one gets its own block and is copied
        elif execution.alias and name == execution.out_names[0]:
            src_name = execution.in_names[0]
            shared, offset = self._block_of.get(src_name), self._offset.get(src_name, 0)
            if shared is not None and (shared.size - offset < n or shared.storage is not StorageType.DYNAMIC):
                shared = None
        if shared is not None:
            shared.refs += 1
            self._block_of[name] = shared
            self._offset[name] = offset
            self._names_of[id(shared)].append(name)
            return shared
        block = self.acquire(n)
        block.refs = 1
        self._block_of[name] = block
        self._names_of[id(block)] = [name]
        return block

    def release(self, block: Block) -> None:
        if block.storage is not StorageType.DYNAMIC:
            return
        block.refs = getattr(block, "refs", 1) - 1
        if block.refs > 0:
            return
        target = max((self._extend.get(n, -1) for n in self._names_of.get(id(block), [])), default=-1)
        if target > self._cursor:
            self._deferred.setdefault(target, []).append(block)
            return
        self.arena.release(block)

    def op_resized(self, exe: CudaOp) -> None:
        """An op's on_resize: note graph outputs, plan scratch, free what fused kernels no longer need."""
        exe.resized = True
        self._cursor = max(self._cursor, exe.step)
        for o in exe.out_names:
            if o and o not in self._acquired:
                self._kept.add(o)  # the pipeline keeps graph outputs out of the arena
        n = exe.scratch_bytes()
        if n:
            blk = self.arena.acquire(n)
            self._scratch[id(exe)] = blk
            self.arena.release(blk)
        for target in [t for t in self._deferred if t <= self._cursor]:
            for blk in self._deferred.pop(target):
                self.arena.release(blk)

    def _dev_nbytes(self, t: Tensor) -> int | None:
        if t.shape is None or t.dtype is None or t.dtype == object:
            return None
        return int(np.prod(t.shape, dtype=np.int64)) * self.dev_dtype(t.dtype).itemsize

    # Binding ----------------------------------------------------------------
    def view(self, name: str) -> "cupy.ndarray":
        """The device array holding a value (a const is uploaded on first use)."""
        v = self._views.get(name)
        if v is not None:
            return v
        if name in self._derived:
            arr = self._derived[name]
            v = self.rt.upload(arr, self.dev_dtype(arr.dtype))
            self._keep.append(arr)
        else:
            t = self._tensors.get(name)
            if t is None or not t.is_const:
                raise BackendError(f"cuda: value {name!r} has no device memory")
            arr = np.asarray(t.const)
            v = self.rt.upload(arr, self.dev_dtype(arr.dtype))
        self._views[name] = v
        return v

    def workspace(self, dtype: np.dtype, count: int) -> "cupy.ndarray":
        """The backend's workspace: ops run one after another on one stream, so they share it."""
        return cupy.ndarray((count,), dtype=dtype, memptr=self._workspace)

    def scratch(self, exe: CudaOp, dtype: np.dtype, count: int) -> "cupy.ndarray":
        blk = self._scratch[id(exe)]
        return cupy.ndarray((count,), dtype=dtype, memptr=self._arena_mem + blk.offset)

    def meta(self, values: list[int], keep: list) -> "cupy.ndarray":
        arr = cupy.asarray(np.asarray(values, dtype=np.int32))
        keep.append(arr)
        return arr

    def blas(self):
        """This backend's cuBLAS handle, on its stream (created on first use)."""
        if self._blas is None:
            from .blas import WORKSPACE_BYTES, Blas

            with self.rt.device:
                self._blas = Blas(self.stream.ptr, self.rt.malloc(WORKSPACE_BYTES))
        return self._blas

    def static(self, name: str):
        return self.rt.static_kernel(name, self.half)

    def launcher(self, kernel, total: int, args: tuple, block: int = BLOCK, grid: int | None = None,
                 shared: int = 0) -> Callable[[], None]:
        if grid is None:
            grid = max(1, min((total + block - 1) // block, 1 << 20))

        def go() -> None:
            kernel((grid,), (block,), args, shared_mem=shared)

        return go

    def on_resize_end(self) -> None:
        with self.rt.device, cupy.cuda.using_allocator(self.rt.pool.malloc):
            binding.bind(self)

    def _after_step(self, step: Step, fns: list) -> None:
        """A hook for debugging tools: called as each step's launches are recorded."""

    # Running ------------------------------------------------------------------
    def submit(self, segment: "Segment", values: dict[str, Any], device: bool = False) -> Fence:
        run = self._runs.get(id(segment.steps[0].execution))
        if run is None:
            raise BackendError("cuda: this segment was not recorded at resize")
        fence = Fence()
        with self.rt.device:
            for name, host, dst in run.inputs:
                runs.copy_in(self, host, values[name], dst)
            values.update(runs.launch(self, run, fence, device))
        return fence

    def after_default_stream(self) -> None:
        """Order the stream after the work queued so far on the default stream: where torch and cupy make
        arrays by default, and where DLPack hands a device input over (aiomnn.feeds)."""
        event = cupy.cuda.Event(disable_timing=True)
        event.record(cupy.cuda.Stream.null)
        self.stream.wait_event(event)

    def profile_segment(self, segment: "Segment", began_ns: int, ended_ns: int) -> None:
        """One event per step that launched kernels (runs.profile)."""
        runs.profile(self, segment, began_ns, ended_ns)

    def _wait_thread(self) -> Waiter:
        if self._waiter is None:
            self._waiter = Waiter()
        return self._waiter

    def clear_buffers(self) -> None:
        super().clear_buffers()
        try:
            self.stream.synchronize()
        except Exception:  # pragma: no cover - a broken context
            pass
        self._reset_plan()

    def __del__(self) -> None:
        waiter = getattr(self, "_waiter", None)
        if waiter is not None:
            waiter.close()
        blas = getattr(self, "_blas", None)
        if blas is not None:
            try:
                blas.close()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass

