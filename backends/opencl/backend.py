"""The OpenCL backend: where each tensor lives on the device, recording kernels at
resize, and one submission per segment at run.

Memory. Activations produced here are offsets in one arena buffer planned by
the pipeline (DYNAMIC); a metadata-only op (Reshape, Squeeze...) aliases its
input, which then stays reserved until the alias is dead too. Graph outputs
and values that come from the host (graph inputs, results of CPU segments)
get their own buffers (DYNAMIC_SEPARATE). Weights and index tables are
uploaded once (STATIC) and kept across resizes.

Running. At resize each op's kernels are built once and their arguments set
once the plan's memory exists. submit() writes the host values the segment
needs, enqueues every kernel, reads back what the rest of the pipeline needs,
and completes the Fence from one marker callback; it never blocks the loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from aiomnn.backend import Backend, Execution, Tensor
from aiomnn.config import ForwardType
from aiomnn.errors import BackendError
from aiomnn.fence import Fence, offload
from aiomnn.graph import Node
from aiomnn.memory import Arena, Block, StorageType
from aiomnn.profile import OpEvent

from . import ops  # noqa: F401  (registers every op)
from .enqueue import launcher
from .ops.layout import contiguous_copy
from .tune import cached_local_size
from .ops.base import Alias, ClExecution, Const, Decline, In, Launch, OpContext, Out, Scratch, plan

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .runtime import OpenclRuntime

log = logging.getLogger("aiomnn.opencl")


@dataclass(eq=False)
class _SegmentPlan:
    uploads: list[tuple[str, Block, Tensor, np.dtype]]
    launches: list[Launch]
    downloads: list[tuple[str, Block, Tensor, np.dtype]]
    frees: list[str]


class OpenclBackend(Backend):
    type = ForwardType.OPENCL
    reads_consts = False
    runtime: "OpenclRuntime"

    def __init__(self, runtime: "OpenclRuntime", config):
        super().__init__(runtime, config)
        half = config.precision == "low" and runtime.half_ok
        if config.precision == "low" and not half:
            log.info("precision='low': %s has no cl_khr_fp16; computing in fp32", runtime.device.name)
        self.ctx = OpContext(half, precise=config.precision != "low")
        self.arena = Arena(runtime.align)
        self.blocks = []
        self._static: dict[tuple, Block] = {}  # the weights this backend holds (shared through the runtime)
        self._arena_mem: cl.Buffer | None = None
        self._reset_plan()

    def _reset_plan(self) -> None:
        self._locs: dict[str, Block] = {}  # where each value lives on the device in this plan
        self._external: dict[str, tuple[Block, Tensor]] = {}  # values written from the host
        self._tensors: dict[str, Tensor] = {}  # values produced here
        self._separate: list[Block] = []
        self._aliases: list[tuple[Block, Block]] = []  # (alias, root)
        self._refs: dict[int, int] = {}  # id(arena block) -> live users
        self._roots: dict[int, Block] = {}  # id(alias block) -> the arena block it aliases
        self._recorded: list[ClExecution] = []
        self._plans: dict[int, _SegmentPlan] = {}
        self._timed: list[cl.Event] = []  # with profiling on, the last segment's kernel events
        self._static_used: set[tuple] = set()

    # Creation ------------------------------------------------------------------------------------
    def on_create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution | None:
        try:
            launches = plan(self.ctx, node, inputs, outputs)
        except Decline as why:
            log.debug("%s stays on the CPU: %s", node, why)
            return None
        if isinstance(launches, Alias):
            return ClExecution(node, list(inputs), list(outputs), [], alias=launches.index, backend=self)
        try:  # built already when the session prepared this plan on a worker thread
            for launch in launches:
                self.runtime.program(launch.program, self.ctx.options + launch.options)
        except BackendError:
            return None
        return ClExecution(node, list(inputs), list(outputs), launches, backend=self)

    # Memory --------------------------------------------------------------------------------------
    def nbytes(self, t: Tensor) -> int:
        n = self.ctx.storage(t.dtype).itemsize
        for d in t.shape:
            n *= d
        return max(n, 1)

    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        if not isinstance(execution, ClExecution) or tensor.nbytes is None:
            return None
        n = self.nbytes(tensor)
        if execution.alias is not None:
            src = self._input_location(execution.inputs[execution.alias])
            root = self._roots.get(id(src), src)
            block = Block(n, root.storage, root.offset)
            if id(root) in self._refs:  # an arena block stays reserved while an alias of it lives
                self._refs[id(root)] += 1
                self._roots[id(block)] = root
            self._aliases.append((block, root))
        else:
            block = self.arena.acquire(n)
            self._refs[id(block)] = 1
            self.blocks.append(block)
        self._locs[tensor.name] = block
        return block

    def release(self, block: Block) -> None:
        root = self._roots.get(id(block), block)
        users = self._refs.get(id(root))
        if users is None:
            return
        if users <= 1:
            del self._refs[id(root)]
            self.arena.release(root)
        else:
            self._refs[id(root)] = users - 1

    def _separate_block(self, name: str, t: Tensor) -> Block:
        block = Block(self.nbytes(t), StorageType.DYNAMIC_SEPARATE)
        self._separate.append(block)
        self._locs[name] = block
        return block

    def _input_location(self, t: Tensor) -> Block:
        if t.is_const:
            arr = np.asarray(t.const)
            dtype = self.ctx.storage(arr.dtype)
            return self._static_block(("value", t.name, id(t.const), dtype.str),
                                      Const(("value", t.name), lambda: arr, floats=True))
        block = self._locs.get(t.name)
        if block is None:  # it comes from the host: a graph input or a CPU segment's result
            block = self._separate_block(t.name, t)
            self._external[t.name] = (block, t)
        return block

    def _static_block(self, key: tuple, const: Const) -> Block:
        key = key + (self.ctx.float_type,)
        self._static_used.add(key)
        block = self._static.get(key)
        if block is None:
            block = self.runtime.static(key, const, self.ctx)
            self._static[key] = block
        return block

    def on_resize_begin(self) -> None:
        self._clear_dynamic()  # weights stay for the next plan

    def clear_buffers(self) -> None:
        """Give back the plan's memory and let go of the weights (shared ones stay with their other users)."""
        self._clear_dynamic()
        self._static.clear()

    def _clear_dynamic(self) -> None:
        pool = self.runtime.pool
        if self._arena_mem is not None:
            pool.release(self._arena_mem)
            self._arena_mem = None
        for b in self._separate:
            if b.memory is not None:
                pool.release(b.memory)
        self.arena = Arena(self.runtime.align)
        self.blocks = []
        self._reset_plan()

    # Recording -----------------------------------------------------------------------------------
    def record(self, exe: ClExecution, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        """on_resize of one op: decide where its tensors live, build its kernels."""
        if exe.alias is not None and (not outputs[0].name or outputs[0].block is None):
            exe.launches, exe.alias = [contiguous_copy(self.ctx, exe.inputs[exe.alias], outputs[0])], None
        for i, t in enumerate(inputs):
            if t is not None and t.name:
                exe.locations[(In, i)] = self._input_location(t)
        for i, t in enumerate(outputs):
            if t.name:
                block = self._locs.get(t.name)
                if block is None:
                    block = self._separate_block(t.name, t)
                exe.locations[(Out, i)] = block
                self._tensors[t.name] = t
        tuner = self.runtime.tuner
        for launch in exe.launches:
            for a in launch.args:
                if isinstance(a, Scratch):  # lives for this op only; later tensors may reuse it
                    block = self.arena.acquire(a.nbytes)
                    self.blocks.append(block)
                    exe.locations[(Scratch, id(a))] = block
                    self.arena.release(block)
                elif isinstance(a, Const):
                    exe.locations[(Const, id(a))] = self._static_block(a.key, a)
            program = self.runtime.program(launch.program, self.ctx.options + launch.options)
            launch.cl_kernel = cl.Kernel(program, launch.kernel)
            lws = launch.local
            if launch.tune and lws is None:
                lws = cached_local_size(self.runtime, tuner, self.ctx, launch)
            launch.lws = lws or self.runtime.default_local(launch.size)
            launch.gws = self.runtime.global_size(launch.size, launch.lws)
            launch.enqueue = launcher(self.runtime.queue, launch.cl_kernel, launch.gws, launch.lws)
        self._recorded.append(exe)

    def on_resize_end(self) -> None:
        pool = self.runtime.pool
        if self.arena.size:
            self._arena_mem = pool.acquire(self.arena.size)
        for b in self.blocks:
            b.memory = self._arena_mem
        for b in self._separate:
            b.memory = pool.acquire(b.size)
        for alias, root in self._aliases:
            alias.memory = root.memory
        for exe in self._recorded:
            for launch in exe.launches:
                self._bind(exe, launch)
        if self._recorded:  # let go of weights no op of this plan uses (folded constants of older shapes)
            for key in [k for k in self._static if k not in self._static_used]:
                del self._static[key]

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
    def _segment_plan(self, segment: "Segment") -> _SegmentPlan:
        plan = self._plans.get(id(segment))
        if plan is not None:
            return plan
        freed = {x for f in segment.frees for x in f}
        uploads = []
        for x in segment.needs:
            if x in self._external:
                block, t = self._external[x]
                uploads.append((x, block, t, self.ctx.storage(t.dtype)))
        launches = [l for s in segment.steps for l in s.execution.launches]
        downloads = []
        for s in segment.steps:
            for o in s.outputs:
                if o and o not in freed and o in self._tensors:
                    t = self._tensors[o]
                    downloads.append((o, self._locs[o], t, self.ctx.storage(t.dtype)))
        plan = _SegmentPlan(uploads, launches, list(dict.fromkeys(downloads)), sorted(freed))
        self._plans[id(segment)] = plan
        return plan

    def submit(self, segment: "Segment", values: dict[str, Any], device: bool = False) -> Fence:
        """Enqueue the segment on the runtime's submit thread; the fence completes when the device is done.

        Enqueueing is cheap on a GPU driver, but PoCL compiles a kernel the first time it is
        enqueued, so it never happens on the event loop.
        """
        fence = Fence()
        try:
            offload(self.runtime.submitter, self._enqueue_or_fail, self._segment_plan(segment), values, fence)
        except RuntimeError:  # the executor is shut down
            fence.signal(error=BackendError("the OpenCL runtime is closed"))
        return fence

    def _enqueue_or_fail(self, plan: _SegmentPlan, values: dict[str, Any], fence: Fence) -> None:
        try:
            self._enqueue(plan, values, fence)
        except BaseException as exc:
            fence.signal(error=exc if isinstance(exc, BackendError)
                         else BackendError(f"OpenCL run failed: {type(exc).__name__}: {exc}"))

    def _enqueue(self, plan: _SegmentPlan, values: dict[str, Any], fence: Fence) -> None:
        q = self.runtime.queue
        held: list[Any] = []  # host arrays and their transfer events, alive until the run completes
        for name, block, t, storage in plan.uploads:
            host = np.asarray(values[name], dtype=storage)
            if not host.flags.c_contiguous:
                host = host.copy(order="C")
            if host.shape != t.shape:
                raise BackendError(f"value {name!r} has shape {host.shape}, the plan expects {t.shape}")
            held.append((host, cl.enqueue_copy(q, block.memory, host, dst_offset=block.offset, is_blocking=False)))
        if self.profile is None:
            for i, launch in enumerate(plan.launches):
                launch.enqueue()
                if i % 32 == 7:  # let the device start while the rest is enqueued
                    q.flush()
        else:  # with an event per kernel, read in profile_segment
            self._timed = [cl.enqueue_nd_range_kernel(q, launch.cl_kernel, launch.gws, launch.lws)
                           for launch in plan.launches]
        results = []
        for name, block, t, storage in plan.downloads:
            host = np.empty(t.shape, dtype=storage)
            held.append(cl.enqueue_copy(q, host, block.memory, src_offset=block.offset, is_blocking=False))
            results.append((name, host, t.dtype))
        for x in plan.frees:
            values.pop(x, None)
        marker = cl.enqueue_marker(q)

        def done(status: int) -> None:
            try:
                if status < 0:
                    raise BackendError(f"OpenCL run failed with status {status}")
                for name, host, dtype in results:
                    values[name] = host if host.dtype == dtype else host.astype(dtype)
                held.clear()
                fence.signal()
            except BaseException as exc:  # errors raised in a callback would be lost: hand them over
                fence.signal(error=exc)

        marker.set_callback(cl.command_execution_status.COMPLETE, done)
        q.flush()

    def profile_segment(self, segment: "Segment", began_ns: int, ended_ns: int) -> None:
        """One event per op that launched kernels: the device time of its kernels, from their profiling
        events, placed from the segment's start on the host."""
        events, self._timed = self._timed, []
        if not events:
            return
        origin = events[0].profile.start
        i = 0
        for s in segment.steps:
            n = len(s.execution.launches)
            if not n:
                continue
            mine, i = events[i:i + n], i + n
            name, op_type, args = self.profile.describe([s.node])
            dur = sum(e.profile.end - e.profile.start for e in mine)
            self.profile.add(OpEvent(name, op_type, "opencl", began_ns + mine[0].profile.start - origin, dur,
                                     {**args, "clock": "device", "kernels": [l.kernel for l in s.execution.launches]}))


