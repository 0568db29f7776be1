"""Reductions over contiguous axes, global pooling, Softmax and LayerNormalization."""

from __future__ import annotations

import numpy as np

from aiomnn import shapes

from ..program import launcher
from .base import CudaOp, Decline, check_tensors, float_inputs, op

REDUCE = {"ReduceSum": (0, False), "ReduceMean": (0, True), "ReduceMax": (1, False), "ReduceMin": (2, False),
          "ReduceSumSquare": (3, False), "ReduceL2": (4, False), "ReduceL1": (5, False),
          "GlobalAveragePool": (0, True), "GlobalMaxPool": (1, False)}


def prod(xs) -> int:
    return int(np.prod(list(xs), dtype=np.int64))


def rows_launch(exe: CudaOp, name: str, rows: int, R: int, args: tuple):
    """A reduce/softmax launch: a block per row when rows are long, else a warp per row.

    A warp per long row leaves too few loads in flight to use the memory's bandwidth (det b8's
    GlobalAveragePool over 768 rows of 160x160)."""
    be = exe.be
    if name == "reduce" and R >= 2048:
        return launcher(be.static("reduce_block"), rows * 256, args, block=256, grid=rows)
    kern = be.static(f"{name}_warp")
    return launcher(kern, rows * 32, args, block=128)


#: Rows are reduced in slices of at least this many values where there are fewer rows than twice the SMs.
SLICE = 512


def reduce_slices(be, rows: int, R: int) -> int:
    """How many slices each row is reduced in: enough that rows x slices blocks fill twice the SMs.
    With a block per row, det's GlobalAveragePools at batch 1 (24 or 96 rows of 160x160) left most SMs
    idle."""
    want = 2 * be.rt.sm_count
    if rows >= want:
        return 1
    return max(1, min(-(-want // rows), R // SLICE))


class Reduce(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins[:1], outs)
        if not float_inputs(ins[:1]):
            raise Decline("float32 only")
        s = self.in_shape(0)
        t = node.op_type
        self.code, mean = REDUCE[t]
        if t.startswith("Global"):
            axes = list(range(2, len(s)))
        else:
            axes = shapes.reduce_axes(node, ins, len(s))
            if axes is None:
                raise Decline("axes unknown")
        if not axes or axes != list(range(axes[0], axes[-1] + 1)):
            raise Decline("reduced axes must be one contiguous range")
        self.outer, self.R, self.inner = prod(s[: axes[0]]), prod(s[axes[0]: axes[-1] + 1]), prod(s[axes[-1] + 1:])
        if self.R == 0:
            raise Decline("empty reduction")
        self.post = 1.0 / self.R if mean else 1.0
        self.slices = reduce_slices(be, self.outer, self.R) if self.inner == 1 else 1

    def workspace_bytes(self) -> int:
        return 4 * self.outer * self.slices if self.slices > 1 else 0

    def bind(self, plan):
        x, y = plan.view(self.in_names[0]), plan.view(self.out_names[0])
        if self.outer * self.inner == 0:
            return
        if self.slices > 1:
            be, rows, s = self.be, self.outer, self.slices
            part = plan.workspace(np.float32, rows * s)
            self.launches = [
                launcher(be.static("reduce_slices"), rows * s * 256,
                         (x, part, np.uint32(self.R), np.uint32(s), np.int32(self.code)), block=256, grid=rows * s),
                launcher(be.static("reduce_parts"), rows,
                         (part, y, np.uint32(rows), np.uint32(s), np.int32(self.code), np.float32(self.post)))]
        elif self.inner == 1:
            args = (x, y, np.uint32(self.outer), np.uint32(self.R), np.int32(self.code), np.float32(self.post))
            self.launches = [rows_launch(self, "reduce", self.outer, self.R, args)]
        else:
            args = (x, y, np.uint32(self.outer), np.uint32(self.R), np.uint32(self.inner), np.int32(self.code),
                    np.float32(self.post))
            self.launches = [launcher(self.be.static("reduce_cols"), self.outer * self.inner, args)]


for _t in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2", "ReduceL1"):
    op(_t)(Reduce)
op("GlobalAveragePool")(Reduce)
op("GlobalMaxPool")(Reduce)


class Softmax(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs)
        if not float_inputs(ins):
            raise Decline("float32 only")
        s = self.in_shape(0)
        if not s:
            raise Decline("scalar softmax")
        if node.opset < 13:
            axis = node.attrs.get("axis", 1) % len(s)
            self.outer, self.R, self.inner = prod(s[:axis]), prod(s[axis:]), 1
        else:
            axis = node.attrs.get("axis", -1) % len(s)
            self.outer, self.R, self.inner = prod(s[:axis]), s[axis], prod(s[axis + 1:])
        self.log = node.op_type == "LogSoftmax"

    def bind(self, plan):
        x, y = plan.view(self.in_names[0]), plan.view(self.out_names[0])
        if self.outer * self.inner * self.R == 0:
            return
        if self.inner == 1:
            args = (x, y, np.uint32(self.outer), np.uint32(self.R), np.int32(self.log))
            self.launches = [rows_launch(self, "softmax", self.outer, self.R, args)]
        else:
            args = (x, y, np.uint32(self.outer), np.uint32(self.R), np.uint32(self.inner), np.int32(self.log))
            self.launches = [launcher(self.be.static("softmax_cols"), self.outer * self.inner, args)]


op("Softmax")(Softmax)
op("LogSoftmax")(Softmax)


@op("LayerNormalization", 17)
class LayerNorm(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs[:1])
        if not float_inputs(ins) or any(o.name for o in outs[1:]):
            raise Decline("float32 only, no Mean/InvStdDev outputs")
        s = self.in_shape(0)
        axis = node.attrs.get("axis", -1) % len(s)
        self.rows, self.R = prod(s[:axis]), prod(s[axis:])
        for i in (1, 2):
            if i < len(ins) and ins[i] is not None:
                if prod(ins[i].shape) != self.R:
                    raise Decline("scale and bias must cover the normalized axes")
        self.eps = float(node.attrs.get("epsilon", 1e-5))

    def bind(self, plan):
        x, y = plan.view(self.in_names[0]), plan.view(self.out_names[0])
        g = plan.view(self.in_names[1])
        b = plan.view(self.in_names[2]) if len(self.in_names) > 2 and self.in_names[2] else None
        if self.rows * self.R == 0:
            return
        null = np.uintp(0)
        args = (x, g, b if b is not None else null, y, np.uint32(self.rows), np.uint32(self.R), np.float32(self.eps))
        self.launches = [launcher(self.be.static("layernorm_warp"), self.rows * 32, args, block=128)]
