"""The softmax family: Softmax, LogSoftmax and Hardmax.

Before opset 13 they treat the input as 2-D, flattened at `axis` (default 1); from 13 they work along the one
`axis` (default -1). float16 and bfloat16 compute in their own dtype, as the ONNX reference does. Softmax in
float32 takes the compiled loops: over the last axis a row a piece, over an axis before it (YOLOv8's box
distributions) blocks of columns.
"""

from __future__ import annotations

import math

import numpy as np

from .. import jit
from ..execution import CpuOp, op
from ..threads import SLICE_ELEMENTS
from .dtypes import F32, NO_ROWS, out_buffer, stats_dtype
from .tensor import norm_axis

#: Columns a block of softmax_axis takes: a few rows of them stay in L1 while the block is reduced.
AXIS_BLOCK = 512


def softmax_axis(x: np.ndarray, out: np.ndarray, axis: int) -> bool:
    """out = softmax(x) over an axis before the last (YOLOv8's box distributions, over axis 1), by the compiled
    loop, blocks of columns shared among threads; False (nothing done) where it cannot serve."""
    if x.dtype != F32 or out.dtype != F32 or not x.flags.c_contiguous or not out.flags.c_contiguous or x.size == 0:
        return False
    O, N, I = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])
    blocks = O * -(-I // AXIS_BLOCK)
    sums = np.empty((blocks, AXIS_BLOCK), F32)
    xs, ys = x.reshape(O, N, I), out.reshape(O, N, I)
    return jit.split("softmax_axis", blocks, max(1, SLICE_ELEMENTS // (N * AXIS_BLOCK)), xs, ys, sums,
                     AXIS_BLOCK) is not None


def softmax_rows(x: np.ndarray, out: np.ndarray) -> bool:
    """out = softmax(x) over the last axis, by the compiled loop, rows shared among threads (jit.split); False
    (nothing done) where it cannot serve (see jit.elementwise)."""
    if x.dtype != F32 or out.dtype != F32 or x.ndim == 0 or not out.flags.c_contiguous or x.size == 0:
        return False
    if jit.jitted("softmax") is None:
        return False
    cols = x.shape[-1]
    np.copyto(out, x)
    ys = out.reshape(-1, cols)
    return jit.split("softmax", ys.shape[0], max(1, SLICE_ELEMENTS // cols), ys, 1.0, NO_ROWS, 1, 0) is not None


class SoftmaxBase(CpuOp):
    writes_outputs = True
    kind = "softmax"

    def __init__(self, node, inputs, outputs, axis=None):
        super().__init__(node, inputs, outputs)
        self.legacy = node.opset < 13
        self.axis = (1 if self.legacy else -1) if axis is None else int(axis)

    def run(self, x):
        if x.ndim == 0:
            raise ValueError(f"{self.node.op_type} needs an input of rank 1 or more")
        ax = norm_axis(self.axis, x.ndim)
        if self.legacy:
            lead = math.prod(x.shape[:ax])
            xv = x.reshape(lead, -1)
            red = 1
        else:
            xv = x
            red = ax
        if self.kind == "hardmax":
            y = np.zeros(xv.shape, x.dtype)
            if xv.shape[red]:
                idx = np.expand_dims(np.argmax(xv, axis=red), red)
                np.put_along_axis(y, idx, 1, axis=red)
            return y.reshape(x.shape)
        # float16/bfloat16 compute in their own dtype (with numpy's float accumulation in the sums),
        # as the ONNX reference does; float32 and float64 natively.
        cdt = x.dtype if x.dtype.kind == "f" or x.dtype.name == "bfloat16" else stats_dtype(x.dtype)
        native = cdt == x.dtype
        out = out_buffer(self.out[0], x.shape, x.dtype)
        if self.kind == "softmax" and red == xv.ndim - 1 and softmax_rows(xv, out.reshape(xv.shape)):
            return out
        if self.kind == "softmax" and red < xv.ndim - 1 and softmax_axis(xv, out.reshape(xv.shape), red):
            return out
        y = out.reshape(xv.shape) if native else np.empty(xv.shape, cdt)
        xc = xv if native else xv.astype(cdt)
        # The ufuncs' reduce methods: np.max and np.sum add microseconds of Python per call.
        m = np.maximum.reduce(xc, axis=red, keepdims=True)
        np.subtract(xc, m, out=y)
        if self.kind == "softmax":
            np.exp(y, out=y)
            s = np.add.reduce(y, axis=red, keepdims=True)
            y /= s
        else:
            e = np.exp(y)
            s = np.log(np.sum(e, axis=red, keepdims=True))
            y -= s
        if not native:
            out[...] = y.reshape(x.shape)
        return out


def _softmax_op(name: str, kind: str) -> None:
    cls = type(name, (SoftmaxBase,), {"kind": kind})
    op(name, 1)(cls)
    op(name, 13)(type(name + "13", (cls,), {}))


_softmax_op("Softmax", "softmax")
_softmax_op("LogSoftmax", "logsoftmax")
_softmax_op("Hardmax", "hardmax")
