"""What every CUDA op is: an Execution that plans at resize and launches into the recorded graph.

An op is made with its backend, whose precision, runtime and program it reads; once the resize's memory is
planned it binds to the backend's plan (plan.py), whose device arrays it reads.

An op may carry `group`, an expression for its output 0 (fused.Term). The
backend turns groups into generated kernels and fuses an elementwise consumer
with its producers when nothing else reads the value in between: a
Conv -> Add -> Clip -> Mul -> Div chain becomes one GEMM and one kernel.

- consumer: the op is elementwise; its group may absorb its producers' groups.
- absorbable: the op's group may be absorbed (its raw result or inline leaf
  stays valid until the consumer runs).
- alias: output 0 is input 0 re-viewed (Reshape and friends): no copy when the
  planner lets them share a block.
- tiled: the op's Inline leaf shapes the whole kernel (the implicit-GEMM conv);
  a group holds at most one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from aiomnn.backend import Decline, Execution, OpRegistry, Tensor
from aiomnn.graph import Node

if TYPE_CHECKING:
    from ..backend import CudaBackend
    from ..plan import Plan

OPS: OpRegistry[Any] = OpRegistry("cuda")

F32 = np.dtype(np.float32)
MAX_ELEMENTS = (1 << 31) - 1


def op(op_type: str, since: int = 1):
    return OPS.register(op_type, since)


class CudaOp(Execution):
    consumer = False
    absorbable = False
    alias = False
    tiled = False  # an Inline leaf that is a whole tiled kernel (tiled_code), its epilogue per output

    def __init__(self, be: "CudaBackend", node: Node, ins: list[Tensor | None], outs: list[Tensor]):
        self.be = be
        self.node = node
        self.ins = ins
        self.outs = outs
        self.in_names = [t.name if t is not None else "" for t in ins]
        self.out_names = [t.name for t in outs]
        self.group = None  # fused.Term for output 0
        self.step = -1
        self.resized = False
        self.launches: list[Callable[[], None]] = []
        self.keep: list[Any] = []  # device arrays the launches use

    # Helpers for subclasses -------------------------------------------------
    @property
    def attrs(self) -> dict[str, Any]:
        return dict(self.node.attrs)

    def const(self, i: int) -> np.ndarray | None:
        t = self.ins[i] if i < len(self.ins) else None
        return None if t is None or not t.is_const else np.asarray(t.const)

    def in_shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.ins[i].shape)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.outs[0].shape)

    # Planning ---------------------------------------------------------------
    def scratch_bytes(self) -> int:
        """Device bytes of scratch this op needs while it runs."""
        return 0

    def workspace_bytes(self) -> int:
        """Device bytes of the backend's workspace (shared by all ops) this op's kernel needs."""
        return 0

    def on_resize(self, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        self.be.op_resized(self)

    def bind(self, plan: Plan) -> None:
        """Memory exists now: make views, upload parameters, fill self.launches (main compute)."""

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        raise NotImplementedError("CUDA ops run inside their backend's recorded graph")

    # Group leaves -------------------------------------------------------------
    def raw_strides(self) -> list[int]:
        """Element strides of the raw result over the output shape (a Raw leaf)."""
        from ..fused import leaf_strides

        return leaf_strides(self.out_shape, list(self.out_shape))

    def inline_deps(self) -> list[str]:
        """Values an Inline leaf of this op reads: its first input (an op that reads more says so)."""
        return [self.in_names[0]]

    def inline_ptrs(self, plan: Plan) -> list[Any]:
        """The device arrays an Inline leaf of this op reads, as inline_deps names them."""
        return [plan.view(name) for name in self.inline_deps()]

    def inline_types(self) -> list[str] | None:
        """The C parameter types of an Inline leaf's pointers (inline_ptrs); None: all `const T*`."""
        return None


def float_inputs(ins: list[Tensor | None]) -> bool:
    return all(t is None or t.dtype == F32 for t in ins)


def check_tensors(ins: list[Tensor | None], outs: list[Tensor]) -> None:
    for t in list(ins) + list(outs):
        if t is None or not t.name:
            continue
        if t.kind != "tensor" or t.shape is None or t.dtype is None or t.dtype == object:
            raise Decline(f"{t.name}: shape or dtype unknown")
        if int(np.prod(t.shape, dtype=np.int64)) > MAX_ELEMENTS:
            raise Decline(f"{t.name}: too many elements for 32-bit indexing")
