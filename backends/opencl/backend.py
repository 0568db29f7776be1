"""The OpenCL backend: the pipeline's hooks, handed to the Plan of the current resize (plan.py: where each
tensor lives, the recorded kernels) and to the runtime's queue (queue.py: one submission per segment, whose
Fence a marker's callback completes, so a run never blocks the loop). It keeps every node it was offered in an
alloc pass, so that when the resize begins it knows every reader of each value and can find the groups of ops
that fewer kernels do (fusion.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aiomnn.backend import Backend, Execution, Tensor
from aiomnn.config import ForwardType
from aiomnn.errors import BackendError
from aiomnn.fence import Fence
from aiomnn.graph import Node
from aiomnn.memory import Block
from aiomnn.offered import Offered
from aiomnn.profile import OpEvent

# Importing the package ops/ registers every op.
from .fusion import plan_fusions
from .ops.base import Alias, ClExecution, Decline, OpContext, launches_for
from .plan import Plan
from .tune import settle

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .runtime import OpenclRuntime

log = logging.getLogger("aiomnn.opencl")


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
        self._timed: list | None = None  # with profiling on, the last segment's kernel events
        self.looks = config.power != "low"  # the event loop may look at this backend's runs (queue.py)
        # The fusion plan (fusion.plan_fusions) reads who makes and who reads each value from the ops offered.
        self.offered = Offered()
        self._new_plan({})

    def _new_plan(self, weights: dict[tuple, Block]) -> None:
        self.plan = Plan(self.runtime, self.ctx, weights)
        self.arena, self.blocks = self.plan.arena, self.plan.blocks  # the core reads a backend's arena

    # Creation ------------------------------------------------------------------------------------
    def on_create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution | None:
        exe = self._create(node, inputs, outputs)
        self.offered.add(node, exe, inputs, outputs)
        return exe

    def _create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> ClExecution | None:
        try:
            launches = launches_for(self.ctx, node, inputs, outputs)
        except Decline as why:
            log.debug("%s stays on the CPU: %s", node, why)
            return None
        if isinstance(launches, Alias):
            return ClExecution(node, list(inputs), list(outputs), [], alias=launches.index, backend=self)
        try:  # built already when the session prepared this plan on a worker thread
            for launch in launches:
                run = settle(self.runtime, self.ctx, launch)
                self.runtime.programs.build(run.program, self.ctx.options + run.options)
        except BackendError:
            return None
        return ClExecution(node, list(inputs), list(outputs), launches, backend=self)

    # Memory --------------------------------------------------------------------------------------
    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        if not isinstance(execution, ClExecution) or tensor.nbytes is None:
            return None
        return self.plan.acquire(tensor, execution)

    def release(self, block: Block) -> None:
        self.plan.release_block(block)

    def on_resize_begin(self) -> None:
        self.plan.release()
        self._new_plan(self.plan.weights)  # weights stay for the next plan
        created = self.offered.take()
        plan_fusions(self.plan, created)
        self.plan.plan_places(created)

    def on_resize_end(self) -> None:
        self.plan.finish()

    def clear_buffers(self) -> None:
        """Give back the plan's memory and let go of the weights (shared ones stay with their other users)."""
        self.plan.release()
        self._new_plan({})

    # Running ----------------------------------------------------------------------------------------
    def submit(self, segment: "Segment", values: dict[str, Any], device: bool = False) -> Fence:
        """Enqueue the segment on the runtime's submit thread; the fence completes when the device is done."""
        self._timed = None if self.profile is None else []  # with an event per kernel, read in profile_segment
        return self.runtime.queue.submit(self.plan.segment(segment), values, self._timed, self.looks)

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
                                     {**args, "clock": "device", "kernels": [_ran(l) for l in s.execution.launches]}))


def _ran(launch) -> str:
    """The kernel a launch runs: for one with tiles (tiles.py), the kernel of its choice."""
    return launch.cl_kernel.function_name if launch.cl_kernel is not None else launch.kernel
