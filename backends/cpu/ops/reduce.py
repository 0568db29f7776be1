"""Reductions (Reduce*, ArgMax/ArgMin), scans (CumSum, CumProd) and TopK."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..execution import CpuOp, Unsupported, op
from .dtypes import ML_FLOATS, ML_INTS, compute_dtype

I64 = np.dtype(np.int64)


def _ints(v: Any) -> list[int] | None:
    if v is None:
        return None
    return [int(a) for a in np.asarray(v).reshape(-1)]


def _axis(a: int, rank: int, what: str = "axis") -> int:
    r = max(rank, 1)
    if not -r <= a < r:
        raise ValueError(f"{what} {a} is out of range for rank {rank}")
    return a % r


def _lowest(dt: np.dtype) -> Any:
    if dt.kind == "b":
        return False
    if dt.kind in "iu":
        return np.iinfo(dt).min
    return -np.inf


def _highest(dt: np.dtype) -> Any:
    if dt.kind == "b":
        return True
    if dt.kind in "iu":
        return np.iinfo(dt).max
    return np.inf


class Reduce(CpuOp):
    """A reduction over `axes`: axes are an attribute before `input_since` and an input from it."""

    input_since = 18

    def __init__(self, node, inputs, outputs, axes=None, keepdims=1, noop_with_empty_axes=0):
        super().__init__(node, inputs, outputs)
        self.from_input = node.opset >= self.input_since
        if self.from_input and axes is not None:
            raise Unsupported(f"opset {node.opset} takes axes as an input, not an attribute")
        self.attr_axes = axes
        self.keepdims = bool(keepdims)
        self.noop = bool(noop_with_empty_axes)

    def run(self, x, axes=None):
        if x.dtype == object or x.dtype in ML_INTS:
            raise TypeError(f"{self.node.op_type} does not take {x.dtype}")
        axes = _ints(axes) if self.from_input else self.attr_axes
        dt = x.dtype
        w = x.astype(compute_dtype(dt)) if compute_dtype(dt) != dt else x
        with np.errstate(all="ignore"):
            if not axes:
                if self.noop:
                    return self.finish(self.post(self.pre(w)), dt)
                ax: tuple[int, ...] = tuple(range(x.ndim))
            else:
                ax = tuple(sorted({_axis(a, x.ndim, "axes value") for a in axes}))
            return self.finish(self.post(self.core(self.pre(w), ax, self.keepdims)), dt)

    @staticmethod
    def finish(r: Any, dt: np.dtype) -> np.ndarray:
        r = np.asarray(r)
        return r if r.dtype == dt else r.astype(dt)

    def pre(self, x: np.ndarray) -> np.ndarray:
        return x

    def post(self, r: np.ndarray) -> np.ndarray:
        return r

    def core(self, x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        return np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype if x.dtype.kind != "b" else None)


class ReduceSum(Reduce):
    input_since = 13


class ReduceMean(Reduce):
    def core(self, x, axes, keepdims):
        # The mean of an empty set is 0/0, NaN; integers average in float64, truncated by finish().
        n = 1
        for a in axes:
            n *= x.shape[a]
        s = np.sum(x, axis=axes, keepdims=keepdims, dtype=np.float64 if x.dtype.kind in "iub" else x.dtype)
        return s / s.dtype.type(n)


class ReduceMax(Reduce):
    def core(self, x, axes, keepdims):
        return np.max(x, axis=axes, keepdims=keepdims, initial=_lowest(x.dtype))


class ReduceMin(Reduce):
    def core(self, x, axes, keepdims):
        return np.min(x, axis=axes, keepdims=keepdims, initial=_highest(x.dtype))


class ReduceProd(Reduce):
    def core(self, x, axes, keepdims):
        return np.prod(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


class ReduceL1(Reduce):
    def pre(self, x):
        return np.abs(x)


class ReduceL2(Reduce):
    def pre(self, x):
        return np.square(x)

    def post(self, r):
        return np.sqrt(r) if r.dtype.kind == "f" else np.sqrt(r.astype(np.float64))


class ReduceSumSquare(Reduce):
    def pre(self, x):
        return np.square(x)


class ReduceLogSum(Reduce):
    def post(self, r):
        return np.log(r) if r.dtype.kind == "f" else np.log(r.astype(np.float64))


class ReduceLogSumExp(Reduce):
    def pre(self, x):
        return x if x.dtype.kind == "f" else x.astype(np.float64)

    def core(self, x, axes, keepdims):
        if x.size == 0:
            m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
        else:
            m = np.max(x, axis=axes, keepdims=True)
        m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
        s = np.sum(np.exp(x - m), axis=axes, keepdims=True)
        r = np.log(s) + m
        return r if keepdims else np.squeeze(r, axis=axes)


for _cls in (ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare,
             ReduceLogSum, ReduceLogSumExp):
    op(_cls.__name__, 1)(_cls)


# ------------------------------------------------------------------ ArgMax/ArgMin
class ArgReduce(CpuOp):
    fn = staticmethod(np.argmax)

    def __init__(self, node, inputs, outputs, axis=0, keepdims=1, select_last_index=0):
        super().__init__(node, inputs, outputs)
        self.axis, self.keepdims, self.last = axis, bool(keepdims), bool(select_last_index)

    def run(self, x):
        if x.dtype in ML_FLOATS:
            x = x.astype(np.float32)
        elif x.dtype in ML_INTS:
            x = x.astype(np.int8)
        if x.ndim == 0:
            x = x.reshape(1)
        axis = _axis(self.axis, x.ndim)
        if x.shape[axis] == 0:
            raise ValueError(f"{self.node.op_type} over an empty axis")
        if self.last:
            r = x.shape[axis] - 1 - self.fn(np.flip(x, axis), axis=axis)
        else:
            r = self.fn(x, axis=axis)
        r = np.asarray(r, dtype=I64)
        return np.expand_dims(r, axis) if self.keepdims else r


class ArgMax(ArgReduce):
    fn = staticmethod(np.argmax)


class ArgMin(ArgReduce):
    fn = staticmethod(np.argmin)


op("ArgMax", 1)(ArgMax)
op("ArgMin", 1)(ArgMin)


# --------------------------------------------------------------------- scans
def _scan(x: np.ndarray, axis: Any, exclusive: int, reverse: int, product: bool) -> np.ndarray:
    a = np.asarray(axis).reshape(-1)
    if a.size != 1 or a.dtype.kind not in "iu":
        raise ValueError(f"the axis input must be one integer, got {axis!r}")
    if x.ndim == 0:
        return np.array(x, copy=True)
    ax = _axis(int(a[0]), x.ndim)
    dt = x.dtype
    w = x.astype(compute_dtype(dt)) if compute_dtype(dt) != dt else x
    if reverse:
        w = np.flip(w, ax)
    with np.errstate(all="ignore"):
        y = (np.cumprod if product else np.cumsum)(w, axis=ax, dtype=w.dtype)
    if exclusive and y.shape[ax]:
        y = np.roll(y, 1, axis=ax)
        first = [slice(None)] * y.ndim
        first[ax] = 0
        y[tuple(first)] = 1 if product else 0
    if reverse:
        y = np.flip(y, ax)
    return np.ascontiguousarray(y).astype(dt, copy=False)


@op("CumSum", 11)
def cumsum(x, axis, exclusive=0, reverse=0):
    return _scan(x, axis, exclusive, reverse, product=False)


@op("CumProd", 26)
def cumprod(x, axis, exclusive=0, reverse=0):
    return _scan(x, axis, exclusive, reverse, product=True)


# ---------------------------------------------------------------------- TopK
def top_k(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (or smallest) along axis, sorted; equal values keep the lower index first."""
    if x.ndim == 0:
        raise ValueError("TopK needs an input of rank 1 or more")
    axis = _axis(axis, x.ndim)
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"TopK k={k} is out of range for an axis of size {n}")
    key = x.astype(np.float32) if x.dtype in ML_FLOATS else x
    if largest:
        # A stable ascending sort of the reversed axis, read backwards: values descending, ties by index ascending.
        rev = np.flip(key, axis)
        order = np.argsort(rev, axis=axis, kind="stable")
        order = np.flip(order, axis)
        idx = (n - 1) - np.take(order, np.arange(k), axis=axis)
    else:
        order = np.argsort(key, axis=axis, kind="stable")
        idx = np.take(order, np.arange(k), axis=axis)
    idx = idx.astype(I64, copy=False)
    return np.take_along_axis(x, idx, axis=axis), idx


class TopK(CpuOp):
    def __init__(self, node, inputs, outputs, k=None, axis=-1, largest=1, sorted=1):  # noqa: A002
        super().__init__(node, inputs, outputs)
        if node.opset < 10 and k is None:
            raise Unsupported("TopK-1 needs the k attribute")
        self.k, self.axis, self.largest = k, axis, bool(largest)

    def run(self, x, k=None):
        if k is None:
            k = self.k
        else:
            kk = np.asarray(k).reshape(-1)
            if kk.size != 1:
                raise ValueError(f"TopK's K must hold one value, got shape {np.shape(k)}")
            k = int(kk[0])
        return top_k(x, k, self.axis, self.largest)


op("TopK", 1)(TopK)
