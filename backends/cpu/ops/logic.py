"""Comparisons, boolean and bitwise logic, Where."""

from __future__ import annotations

import numpy as np

from ..execution import CpuOp, op
from .dtypes import BOOL, F32, ML_FLOATS, ML_INTS, matches
from .elementwise import legacy_broadcast


def _comparable(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.dtype in ML_FLOATS or b.dtype in ML_FLOATS:
        return a.astype(F32), b.astype(F32)
    if a.dtype in ML_INTS or b.dtype in ML_INTS:
        return a.astype(np.int8), b.astype(np.int8)
    return a, b


class Compare(CpuOp):
    """A broadcasting comparison or boolean op, with a bool result written into the planned buffer."""

    writes_outputs = True
    ufunc: np.ufunc
    operand_kinds = ""  # "b": bool only; "iu": integers only; "": any

    def __init__(self, node, inputs, outputs, broadcast=None, axis=None):
        super().__init__(node, inputs, outputs)
        self.legacy = node.opset < 7 and broadcast is not None
        self.broadcast, self.axis = broadcast, axis

    def run(self, a, b):
        if self.legacy:
            b = legacy_broadcast(a, b, self.broadcast, self.axis)
        if self.operand_kinds and (a.dtype.kind not in self.operand_kinds or b.dtype.kind not in self.operand_kinds):
            raise TypeError(f"{self.node.op_type} does not take {a.dtype} and {b.dtype}")
        a, b = _comparable(a, b)
        shape = np.broadcast_shapes(a.shape, b.shape)
        if a.dtype == object or b.dtype == object:
            return np.asarray(self.ufunc(a, b), dtype=bool).reshape(shape)
        out = matches(self.out[0], shape, BOOL)
        if out is None:
            out = np.empty(shape, BOOL)
        return self.ufunc(a, b, out=out)


def _compare(op_type: str, since: int, ufunc: np.ufunc, kinds: str = "") -> type:
    cls = type(op_type, (Compare,), {"ufunc": ufunc, "operand_kinds": kinds})
    op(op_type, since)(cls)
    return cls


_compare("Equal", 1, np.equal)
_compare("Less", 1, np.less)
_compare("Greater", 1, np.greater)
_compare("LessOrEqual", 12, np.less_equal)
_compare("GreaterOrEqual", 12, np.greater_equal)
_compare("And", 1, np.logical_and, "b")
_compare("Or", 1, np.logical_or, "b")
_compare("Xor", 1, np.logical_xor, "b")


@op("Not", 1)
def not_(x):
    if x.dtype != BOOL:
        raise TypeError(f"Not takes bool, not {x.dtype}")
    return np.logical_not(x)


class Bitwise(CpuOp):
    writes_outputs = True
    ufunc: np.ufunc

    def run(self, a, b):
        if a.dtype.kind not in "iu" or b.dtype != a.dtype:
            raise TypeError(f"{self.node.op_type} takes two tensors of one integer type, not {a.dtype} and {b.dtype}")
        shape = np.broadcast_shapes(a.shape, b.shape)
        out = matches(self.out[0], shape, a.dtype)
        if out is None:
            out = np.empty(shape, a.dtype)
        return self.ufunc(a, b, out=out)


for _name, _ufunc in (("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or), ("BitwiseXor", np.bitwise_xor)):
    op(_name, 18)(type(_name, (Bitwise,), {"ufunc": _ufunc}))


@op("BitwiseNot", 18)
def bitwise_not(x):
    if x.dtype.kind not in "iu":
        raise TypeError(f"BitwiseNot takes integers, not {x.dtype}")
    return np.invert(x)


class Where(CpuOp):
    writes_outputs = True

    def run(self, c, x, y):
        if c.dtype != BOOL:
            raise TypeError(f"Where's condition must be bool, not {c.dtype}")
        shape = np.broadcast_shapes(c.shape, x.shape, y.shape)
        dt = x.dtype
        if y.dtype != dt:
            y = y.astype(dt)
        if dt == object:
            return np.where(c, x, y)
        out = matches(self.out[0], shape, dt)
        if out is None:
            out = np.empty(shape, dt)
        np.copyto(out, np.broadcast_to(y, shape))
        np.copyto(out, np.broadcast_to(x, shape), where=c)
        return out


op("Where", 9)(Where)
