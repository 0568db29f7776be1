"""What every Vulkan op shares: VkOp, the op registry, push-constant packing, shape helpers, activations.

An op class checks the node at creation (raising Decline when a dtype, shape or
attribute is not handled, so the CPU runs it) and, at on_resize, takes the
backend's plan of the current shapes (plan.Plan, `self.plan`) and in its own
`on_plan` calls `self.loc(t)` for the tensors it binds and `self.dispatch(...)`
for each shader launch. Only float32 tensors with known, non-empty shapes are
taken; fp16 storage (precision="low") is the plan's business, not the ops'.
"""

from __future__ import annotations

import logging
import math
import struct
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from aiomnn import geometry, strides, unary
from aiomnn.backend import Decline, Execution, OpRegistry, Tensor, is_f32
from aiomnn.errors import BackendError
from aiomnn.graph import Node
from aiomnn.strides import collapse

from ..launch import Grid, Launch, Work
from ..memory import Loc
from ..record import Dispatch

if TYPE_CHECKING:
    from ..backend import VulkanBackend
    from ..device import Context
    from ..groups import Group
    from ..plan import Plan

log = logging.getLogger("aiomnn.vulkan")

F32 = np.dtype(np.float32)
MAX_RANK = 6
INT_MAX = 2**31 - 1


class f32(float):
    """A push-constant value stored as float32 (plain ints are stored as int32)."""


def pack(*values: Any) -> bytes:
    flat: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
        else:
            flat.append(v)
    fmt = "<" + "".join("f" if isinstance(v, f32) else "i" for v in flat)
    data = struct.pack(fmt, *flat)
    if len(data) > 128:
        raise Decline("push constants over 128 bytes")
    return data


def pad(values: list[int], n: int = MAX_RANK) -> list[int]:
    if len(values) > n:
        raise Decline(f"more than {n} dimensions")
    return list(values) + [0] * (n - len(values))


def broadcast_strides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """Strides of `shape` read as `out` (numpy broadcasting): 0 on broadcast axes; Decline where it does not
    broadcast."""
    if len(shape) > len(out):
        raise Decline("input rank above output rank")
    res = strides.broadcast_strides(shape, out)
    if res is None:
        raise Decline(f"{shape} does not broadcast to {out}")
    return res


def fits(shape, *strides: list[int]) -> None:
    """Decline (at creation, while the CPU can still take the node) an index space the shaders cannot walk."""
    dims, _ = collapse(list(shape), *[list(st) for st in strides])
    if len(dims) > MAX_RANK:
        raise Decline(f"{len(dims)} dimensions after merging, the shaders take {MAX_RANK}")


def numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape is not None else -1


class VkOp(Execution):
    """A node on the Vulkan backend."""

    #: For Reshape-like ops: the input tensor whose memory the output shares.
    alias_of: Tensor | None = None
    #: The index of this op in the backend's created list (None for ops planned alone, as tuning does).
    step: int | None = None
    #: The fused group this op belongs to (see plan_fusions); its last member runs the group's dispatches.
    group: "Group | None" = None
    #: The tuning keys of its group's launches as each member planned them alone, by (kernel, work): the group's
    #: build plans them again (a conv's matmul with a fused residual, a fused activation), and tuning, which
    #: plans ops alone, timed the unfused launches. A fused launch takes the choice of the one it replaces.
    tuned_as: dict[tuple, str] = {}

    #: The plan of the shapes this op was last resized for: where its tensors live, and what it dispatches with.
    plan: "Plan"

    def __init__(self, backend: "VulkanBackend", node: Node, inputs: list[Tensor | None], outputs: list[Tensor]):
        self.backend = backend  # whose plan on_resize takes
        self.ctx: "Context" = backend.ctx  # the device's limits, which the op checks at creation
        self.node = node
        self.attrs = node.attrs
        self.dispatches: list[Dispatch] = []
        self.launches: list[Launch] = []

    def on_resize(self, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        plan = self.plan = self.backend.plan
        self.dispatches = []
        self.launches = []
        self.tuned_as = {}  # a group that still fuses this op sets it again, for this plan's launches
        if self.step is not None:
            plan.advance(self.step)
        plan.exes.append(self)
        self.in_names = [t.name for t in inputs if t is not None and t.name and not t.is_const]
        self.out_names = [t.name for t in outputs if t is not None and t.name]
        self.out_locs = [plan.locate_output(t) if t is not None and t.name else None for t in outputs]
        self.on_plan(inputs, outputs)
        if self.group is not None and self.group.members[-1] is self:
            self.group.apply(self)

    def on_plan(self, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        """Fix this op's dispatches in self.plan (its outputs' places are self.out_locs)."""
        raise NotImplementedError

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        raise BackendError(f"{self.node} runs inside its Vulkan segment, not on its own")

    # Helpers for on_plan() ------------------------------------------------------------
    def loc(self, t: Tensor) -> Loc:
        return self.plan.locate(t)

    def dispatch(self, kernel: str, locs: list[Loc], push: bytes, work: Work, consts: tuple[int, ...] = ()) -> None:
        """Launch `kernel` over `work`, with the workgroup size the tuning cache holds for it, else the default."""
        plan = self.plan
        launch = Launch(plan.ctx, kernel, plan.fp16, consts, push, work, locs)
        self.launches.append(launch)
        choice = plan.runtime.tuned_choice(launch, self.tuned_as.get((kernel, work)))
        name, local, groups = launch.resolve(choice)
        k = plan.programs.kernel(name, plan.fp16, local, consts, push)
        if len(locs) != k.nbind:
            raise BackendError(f"{kernel} takes {k.nbind} bindings, got {len(locs)}")
        self.dispatches.append(Dispatch(k, locs, push, groups))

    def copy(self, dst: Loc, src: Loc, shape: list[int], src_strides: list[int], dst_strides: list[int],
             src_base: int = 0, dst_base: int = 0) -> None:
        n = numel(shape)
        if n == 0:
            return
        dims, (ss, ds) = collapse(list(shape), list(src_strides), list(dst_strides))
        rows = vector_rows(dims, ss, ds, src_base, dst_base)
        if rows is not None:
            self.dispatch("copy_rows", [dst, src], pack(*rows), Grid(rows[0]))
            return
        self.dispatch("copy", [dst, src], pack(n, src_base, dst_base, pad(dims), pad(ss), pad(ds)),
                      Grid(n), consts=(len(dims),))


def vector_rows(dims: list[int], ss: list[int], ds: list[int], src_base: int, dst_base: int) -> tuple[int, ...] | None:
    """copy_rows.comp's fields (items, row length, the two bases, the two row strides: all in four-vectors) for a
    collapsed copy that is rows of unit stride a stride apart, every length, base and stride a whole number of
    four-vectors; else None (the general copy)."""
    if len(dims) > 2 or ss[-1] != 1 or ds[-1] != 1:
        return None
    rows, n = (dims[0], dims[1]) if len(dims) == 2 else (1, dims[0])
    src_row, dst_row = (ss[0], ds[0]) if len(dims) == 2 else (0, 0)
    fields = (n, src_base, dst_base, src_row, dst_row)
    if any(v % 4 for v in fields):
        return None
    return (rows * n // 4, *(v // 4 for v in fields))


#: The Vulkan ops, by op type and the opset version each implementation starts at (the one registry type of
#: every backend: aiomnn.backend.OpRegistry).
OPS: OpRegistry[Callable[..., VkOp]] = OpRegistry("vulkan")


def register(*names: str, since: int = 1):
    """Register an op class for op types `names` from opset `since` on (an op that reads its node's opset itself
    registers once, at 1)."""
    def add(cls):
        for n in names:
            OPS.register(n, since)(cls)
        return cls

    return add


def create(backend: "VulkanBackend", node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> VkOp | None:
    """The op's Vulkan execution, or None to leave it to the backup backend. An op that only moves data
    (geometry.OPS) that no class of its own takes runs as raster regions (raster.py) before it is left."""
    cls = OPS.lookup(node)
    moves = node.domain == "" and node.op_type in geometry.OPS
    if cls is None and not moves:
        return None
    limit = min(backend.ctx.max_range, INT_MAX)
    for t in outputs:
        if t is not None and t.name:
            if not is_f32(t) or numel(t.shape) <= 0 or numel(t.shape) * 4 > limit:
                return None
    # The raster (raster.py) registers under a domain of its own, looked up rather than imported: it builds on
    # this module.
    raster = OPS.lookup(replace(node, domain=geometry.RASTER_DOMAIN)) if moves else None
    for make in filter(None, (cls, raster)):
        try:
            return make(backend, node, inputs, outputs)
        except Decline as why:
            log.debug("%s: %s declines: %s", node, make.__name__, why)
        except Exception as exc:  # a shape or attribute this code did not foresee: the CPU will judge it
            log.debug("%s: %s declines after %s: %s", node, make.__name__, type(exc).__name__, exc)
    log.debug("%s stays on the CPU", node)
    return None


def data_input(t: Tensor | None, backend: "VulkanBackend", what: str = "input") -> Tensor:
    """A float32 tensor with a known, non-empty shape that fits one binding."""
    if not is_f32(t):
        raise Decline(f"{what} is not a float32 tensor of known shape")
    n = numel(t.shape)
    if n <= 0 or n * 4 > min(backend.ctx.max_range, INT_MAX):
        raise Decline(f"{what} has {n} elements")
    return t


def const_value(t: Tensor | None) -> np.ndarray | None:
    if t is None:
        return None
    if not t.is_const:
        raise Decline("a parameter is only known at run time")
    return np.asarray(t.const)


# ------------------------------------------------------------------------ activations
def activation(op: str, attrs: dict[str, Any], opset: int | None = None) -> tuple[int, float, float]:
    """(code, a, b) for unary_op() (shaders/unary_op.glsl, written from the unary table): an activation or
    unary function with its attributes, at this opset (None: a fused activation), its parameters and their
    defaults from aiomnn.unary."""
    return unary.coded(op, attrs, opset)


def fused(node: Node) -> tuple[int, float, float]:
    act = node.attrs.get("_activation")
    if act is None:
        return 0, 0.0, 0.0
    name, attrs = act
    return activation(name, dict(attrs))


def to_f32(v: float) -> f32:
    return f32(np.float32(v)) if math.isfinite(v) else f32(v)
