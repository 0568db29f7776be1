"""How OpenCL ops are written and registered.

An op is a function of the context, the node and its input/output Tensors
(shapes known) that returns the kernel launches it needs, in pure Python: no
device call happens here, so the runtime can also ask it which launches
need tuning. It raises Decline when this node or these shapes are not
handled; the CPU backup then runs the node.

    @op("Relu", 6)
    def relu(ctx, node, ins, outs):
        n = math.prod(ins[0].shape)  # one work item per element; kernels/elementwise.cl's unary, built with ACT=1
        return [Launch("elementwise", "unary", [In(0), Out(0), *i32(n), *f32(0, 0)], (n,), ("-DACT=1",))]

A Launch names a kernel in kernels/<program>.cl, its arguments and the work
items it needs. Buffer arguments are In(i), Out(i) (the node's tensors),
Const(...) (host data uploaded once: repacked weights, index tables) and
Scratch(nbytes). Each buffer becomes two kernel arguments, the cl.Buffer and
its offset in elements, which the kernel adds (`SHIFT(x)`). A Launch with
tiles (Conv, MatMul, Gemm: ../tiles.py) names the work rather than one
kernel: tuning chooses its kernel and tile, and the plan runs that choice, or
the default (tune.settle).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from aiomnn import geometry
from aiomnn.backend import Decline, Execution, OpRegistry, Tensor
from aiomnn.graph import Node

OPS: OpRegistry[Any] = OpRegistry("opencl")

#: Tensor dtypes a kernel may see, and the OpenCL C type of each (bool is uchar).
CL_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float16): "half", np.dtype(np.int32): "int",
            np.dtype(np.int64): "long", np.dtype(np.int8): "char", np.dtype(np.uint8): "uchar",
            np.dtype(np.bool_): "uchar", np.dtype(np.int16): "short", np.dtype(np.uint16): "ushort",
            np.dtype(np.uint32): "uint", np.dtype(np.uint64): "ulong"}

#: Unsigned types of each size, for kernels that only move bytes around.
RAW_TYPES = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}

F32 = np.dtype(np.float32)


def op(op_type: str, since: int = 1, domain: str = ""):
    return OPS.register(op_type, since, domain)


@dataclass(eq=False)
class In:
    index: int


@dataclass(eq=False)
class Out:
    index: int


@dataclass(eq=False)
class Const:
    """Host data uploaded once per plan (weights are cached across plans by `key`)."""

    key: tuple
    make: Callable[[], np.ndarray]
    floats: bool = False  # float32 data stored in the session's float type (fp16 when precision="low")


@dataclass(eq=False)
class Scratch:
    """Device memory for one op's run only, indexed in units of `itemsize` bytes."""

    nbytes: int
    itemsize: int = 4


@dataclass(eq=False)
class Launch:
    program: str
    kernel: str
    args: list[Any]
    size: tuple[int, ...]  # work items needed; the global size is rounded up to whole work groups
    options: tuple[str, ...] = ()
    tune: bool = False  # is its local size worth tuning?
    local: tuple[int, ...] | None = None  # a fixed local size the kernel needs (it uses local memory)
    shared: int = 0  # the local memory a tiled choice's kernel declares, in bytes (tiles.py; tune.fits checks it)
    # The kernels and tiles its work may run (tiles.py: ConvTiles, MatmulTiles): tuning chooses one of them, and
    # the choice makes the launch that runs (tune.settle).
    tiles: Any = None
    # The launch tuning timed where this one is it with a fused epilogue (../epilogues.py): tuning plans ops alone,
    # so a fused launch runs the choice cached for the launch it replaces.
    tuned_as: "Launch | None" = None
    # A Concat's or Split's copy of one piece: (the piece, In(i) or Out(i); the whole; the piece's byte offset in
    # the whole), set only where the piece is one contiguous range of the whole. The plan leaves the launch out
    # where it put the piece there already (Plan.plan_places).
    piece: tuple[Any, Any, int] | None = None
    # Filled when recorded:
    cl_kernel: Any = None
    gws: tuple[int, ...] | None = None
    lws: tuple[int, ...] | None = None
    enqueue: Any = None  # enqueues it on the runtime's queue (Queue.launcher)


@dataclass
class Alias:
    """Metadata only: output 0 is input `index`, reinterpreted with the output's shape."""

    index: int = 0


class OpContext:
    """What ops need to know about the session they plan for."""

    def __init__(self, half: bool, precise: bool = True):
        self.half = half
        self.float_type = "half" if half else "float"
        options = ["-DSTORAGE_HALF"] if half else []
        if precise:  # drivers may divide and take square roots to 2.5 ulp otherwise (NVIDIA does)
            options.append("-cl-fp32-correctly-rounded-divide-sqrt")
        self.options: tuple[str, ...] = tuple(options)

    def storage(self, dtype: np.dtype) -> np.dtype:
        """The dtype a tensor has on the device."""
        return np.dtype(np.float16) if self.half and dtype == F32 else dtype

    def nbytes(self, t: Tensor) -> int:
        """The bytes a tensor takes on the device (at least one)."""
        n = self.storage(t.dtype).itemsize
        for d in t.shape:
            n *= d
        return max(n, 1)


@dataclass(eq=False)
class ClExecution(Execution):
    """One node on OpenCL: its launches, recorded into its backend's Plan at resize, enqueued at run."""

    node: Node
    inputs: list[Tensor | None]
    outputs: list[Tensor]
    launches: list[Launch] = field(default_factory=list)
    alias: int | None = None
    backend: Any = None  # its OpenclBackend, whose plan of the resize under way records it
    locations: dict = field(default_factory=dict)  # (In/Out/Scratch/Const, index or id) -> Block, filled when recorded
    step: int | None = None  # its place in the backend's list of the ops it was offered (fusion.plan_fusions)
    group: Any = None  # the fused group it belongs to (groups.Group), whose last member launches the group's kernels

    def on_resize(self, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        plan = self.backend.plan
        if self.group is not None and self.group.members[-1] is self:
            self.group.apply(plan, self)  # this op's launches and inputs become the group's
            inputs = self.inputs
        plan.record(self, inputs, outputs)
        if self.step is not None:  # after its scratch memory is placed: the values its group read are free now
            plan.advance(self.step)

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        raise RuntimeError("OpenCL executions run through their backend's submit()")


def launches_for(ctx: OpContext, node: Node, inputs: list[Tensor | None],
                 outputs: list[Tensor]) -> list[Launch] | Alias:
    """The launches for a node, or Decline; checks what every op needs first."""
    impl = OPS.lookup(node)
    # The raster (ops/raster.py) runs any data-movement op of aiomnn.geometry, and stands in for one that no op
    # here takes: it registers under a domain of its own, looked up rather than imported (it imports this module).
    raster = None if node.domain else OPS.lookup(replace(node, domain=geometry.RASTER_DOMAIN))
    if impl is None and raster is None:
        raise Decline("no OpenCL kernel")
    for t in list(inputs) + list(outputs):
        if t is None or not t.name:
            continue
        if t.kind != "tensor" or t.shape is None or t.dtype is None or t.dtype not in CL_TYPES:
            raise Decline("shape or type unknown")
        if any(d == 0 for d in t.shape) and not t.is_const:  # an empty constant (Resize's roi) is just unused
            raise Decline("empty tensor")
        if t.nbytes is not None and t.nbytes >= 1 << 31:
            raise Decline("tensor too large for 32-bit offsets")
    why = "no OpenCL kernel"
    if impl is not None:
        try:
            return impl(ctx, node, inputs, outputs)
        except Decline as declined:
            if raster is None:
                raise
            why = str(declined)
    try:
        return raster(ctx, node, inputs, outputs)
    except Decline as declined:
        raise Decline(f"{why}; the raster: {declined}") from None


# Helpers shared by op families ----------------------------------------------------------------------
def require_float(*tensors: Tensor | None) -> None:
    for t in tensors:
        if t is not None and t.name and t.dtype != F32:
            raise Decline("float32 only")


def const_value(t: Tensor | None, what: str) -> np.ndarray:
    if t is None or t.const is None:
        raise Decline(f"{what} must be a constant")
    return np.asarray(t.const)



def i32(*values: int) -> list[np.int32]:
    return [np.int32(v) for v in values]


def f32(*values: float) -> list[np.float32]:
    return [np.float32(v) for v in values]


def act_options(code: int) -> tuple[str, ...]:
    """Build options for a kernel that applies activation `code` (kernels/common.cl)."""
    return (f"-DACT={code}",) if code else ()


def meta(key: tuple, *rows: list[int]) -> Const:
    """A small int32 table of shapes and strides, as one constant buffer."""
    data = np.array([v for row in rows for v in row] or [0], dtype=np.int32)
    return Const(("meta",) + key + tuple(int(v) for v in data), lambda: data)
