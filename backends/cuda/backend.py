"""The CUDA backend: the pipeline's hooks, delegating to the plan of the current resize (plan.py) and the queue
(queue.py); its kernels come from the runtime's program (program.py).

Resize, in the pipeline's order:
  on_create        every runtime node passes here first (CUDA is the main backend), so the backend sees the
                   whole step list and which steps the backup runs.
  on_resize_begin  a new Plan of those steps: which elementwise chains fuse (grouping.py: candidates) and how
                   long their inputs must live, and which Concat and Split pieces share one block so that no
                   copy is needed (aiomnn/places.py).
  acquire_tensor / on_resize / release
                   the pipeline's arena planning (Plan's memory methods): a fused value gets no memory, a
                   value a fused kernel reads later lives until that kernel runs.
  on_resize_end    the final fusion (graph outputs are known now), the arena and staging buffers, kernel
                   compilation and binding, one eager warm-up, then stream capture of each segment into a CUDA
                   graph (binding.py).

A run (submit): the queue copies the inputs to the device, launches the graph (every kernel), copies each output
into a pinned block of cupy's pool that becomes the caller's array (no host copy after the run:
memory.HandedOver), and completes the Fence when the stream reaches its end (queue.WAIT_MODES). A segment made
while the host's rounding to half floats compiled (fp16) is made and recorded again at its first run after the
compile (binding.remake): a one-off wait for the stream, on the caller's thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import cupy
import numpy as np

from aiomnn import geometry
from aiomnn.backend import Backend, Execution, Tensor, all_empty
from aiomnn.config import ForwardType
from aiomnn.errors import BackendError
from aiomnn.fence import Fence
from aiomnn.graph import Node
from aiomnn.memory import Block

from ..cpu import halves
from . import binding, runs
from .ops import OPS, Raster
from .ops.base import CudaOp, Decline
from .plan import F16, F32, Plan, Step, dev_dtype
from .queue import Queue

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .runtime import CudaRuntime

log = logging.getLogger("aiomnn")


class CudaBackend(Backend):
    type = ForwardType.CUDA
    reads_consts = False
    reads_device_arrays = True

    def __init__(self, runtime: CudaRuntime, config, queue: Queue | None = None):
        super().__init__(runtime, config)
        self.rt = runtime
        self.half = config.precision == "low"
        self.t_dtype = F16 if self.half else F32
        if self.half:
            halves.ready()  # the host's rounding to half floats starts compiling, to be ready when runs are made
        # One queue for the backends of a session's kept plans (sibling): when each plan had its own stream and
        # waiter thread, alternating shapes cost 4-29% more a run than a repeated shape on the H200.
        self.queue = queue or Queue(runtime, looks=config.power != "low")
        self.stream = self.queue.stream
        self._created: list[Step] = []
        self._created_nodes: set[int] = set()
        self._tensors_pending: dict[str, Tensor] = {}
        self._derived: dict[str, np.ndarray] = {}
        # The tuner plans its candidates first and records each when it times it (tune.py): the
        # candidates' kernels compile side by side meanwhile.
        self.record_at_resize = True
        self.plan = self._new_plan([], {})

    def sibling(self) -> "CudaBackend":
        self.rt.check_usable()
        return CudaBackend(self.rt, self.config, self.queue)

    def _new_plan(self, steps: list[Step], tensors: dict[str, Tensor]) -> Plan:
        return Plan(self.rt, self.half, self.stream, self._derived, self.arena, steps, tensors)

    @property
    def summary(self) -> dict[str, Any]:
        """The current plan's counts: steps, declined ops, fused steps, segments, launches, graphs, arena bytes."""
        return self.plan.summary

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
        return dev_dtype(dtype, self.half)

    def static(self, name: str):
        """A fixed kernel (kernels.STATIC) at this backend's precision."""
        return self.rt.programs.static_kernel(name, self.half)

    # Planning (called by the pipeline) ----------------------------------------
    def on_resize_begin(self) -> None:
        self.clear_buffers()
        self.plan = self._new_plan(self._created, self._tensors_pending)
        self._created, self._created_nodes, self._tensors_pending = [], set(), {}
        self.plan.begin()

    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        return self.plan.acquire_tensor(tensor, execution)

    def release(self, block: Block) -> None:
        self.plan.release(block)

    def op_resized(self, exe: CudaOp) -> None:
        """An op's on_resize (Plan.op_resized)."""
        self.plan.op_resized(exe)

    def on_resize_end(self) -> None:
        with self.rt.device, cupy.cuda.using_allocator(self.rt.pool.malloc):
            binding.bind(self.plan, self.record_at_resize, self.profile is None)

    # Running ------------------------------------------------------------------
    def submit(self, segment: "Segment", values: dict[str, Any], device: bool = False) -> Fence:
        run = self.plan.runs.get(id(segment.steps[0].execution))
        if run is None:
            raise BackendError("cuda: this segment was not recorded at resize")
        fence = Fence()
        queue = self.queue
        with self.rt.device:
            if halves.settled(run):
                run = binding.remake(self.plan, run, self.profile is None)
            for name, host, dst in run.inputs:
                queue.copy_in(host, values[name], dst)
            values.update(queue.launch(run, fence, device, self.profile is not None))
        return fence

    def profile_segment(self, segment: "Segment", began_ns: int, ended_ns: int) -> None:
        """One event per step that launched kernels (runs.profile)."""
        assert self.profile is not None
        runs.profile(self.profile, self.plan.runs.get(id(segment.steps[0].execution)), began_ns, ended_ns)

    def clear_buffers(self) -> None:
        super().clear_buffers()
        try:
            self.stream.synchronize()
        except Exception:  # pragma: no cover - a broken context
            pass
        self.plan = self._new_plan([], {})
