"""Elementwise ops of two or more inputs: broadcasting arithmetic (Add, Sub, Mul, Div, Pow, Mod, BitShift)
and the variadic Max, Min, Sum and Mean. The one-input ops (unary math, activations, Clip) are in unary.py,
Cast in cast.py, and the in-place activations that fused producers apply in activations.py.

Float ops write into planned buffers (`out=`), so activations reuse memory
and a run allocates little. float16 and the ml_dtypes floats (bfloat16,
float8...) are computed in float32 and rounded once at the end (dtypes.py).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from .. import jit
from ..execution import CpuOp, op

from ..threads import SLICE_ELEMENTS, parallel_slices, threads
from .activations import activation_fn
from .dtypes import F32, ML_INTS, compute_dtype, is_float, matches, memory, repeat_of, widen


# ------------------------------------------------------------- binary arithmetic
def legacy_broadcast(a: np.ndarray, b: np.ndarray, broadcast: int, axis: int | None) -> np.ndarray:
    """Opset < 7 broadcasting: with broadcast=1, B's shape matches A's shape starting at `axis`."""
    if not broadcast:
        if a.shape != b.shape:
            raise ValueError(f"shapes {a.shape} and {b.shape} differ and broadcast=0")
        return b
    if axis is None or b.ndim == 0:
        return b
    axis = axis % a.ndim if a.ndim else 0
    if axis + b.ndim > a.ndim:
        raise ValueError(f"cannot broadcast {b.shape} into {a.shape} at axis {axis}")
    return b.reshape(b.shape + (1,) * (a.ndim - axis - b.ndim))


def _int_div(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics), as ONNX Div on integers does."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        np.floor_divide(a, b, out=out)
        if a.dtype.kind == "i":
            fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
            np.add(out, fix, out=out, casting="unsafe")
    return out


class Binary(CpuOp):
    """A broadcasting binary op. Writes into its planned buffer when the shape and dtype agree."""

    writes_outputs = True
    ufunc: np.ufunc

    #: The compiled loop's op (loops.binary) where it has one.
    looped: int | None = None

    def __init__(self, node, inputs, outputs, broadcast=None, axis=None, consumed_inputs=None, _activation=None):
        super().__init__(node, inputs, outputs)
        self.activation = activation_fn(_activation)
        self.loop_act = jit.loop_activation(_activation)
        self.legacy = node.opset < 7 and broadcast is not None
        self.broadcast, self.axis = broadcast, axis
        self._key: tuple | None = None
        self._kept: tuple | None = None  # the last run's operands, output and the compiled loop's job
        self._seen: tuple | None = None  # where the last run's operands were (memory)

    def compute(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        return self.ufunc(a, b, out=out)

    def run(self, a, b):
        if self.legacy:
            b = legacy_broadcast(a, b, self.broadcast, self.axis)
        key = (a.shape, b.shape, a.dtype, b.dtype)
        if key != self._key:  # numpy's broadcast_shapes costs microseconds: once per shape
            self._key, self._shape = key, np.broadcast_shapes(a.shape, b.shape)
            self._native = a.dtype == b.dtype == compute_dtype(a.dtype)
        shape, dt = self._shape, a.dtype
        out = matches(self.out[0], shape, dt)
        if not self._native:
            return self._run_wide(a, b, shape, out)
        if out is not None and self._looped(a, b, out):
            return out
        if out is None:
            out = np.empty(shape, dt)
        pieces = min(threads(), out.size // SLICE_ELEMENTS)  # (det's feature pyramid adds big maps)
        if pieces > 1:
            self._shared(a, b, out, pieces)
            return out
        with np.errstate(all="ignore"):
            self.compute(a, b, out)
        return out if self.activation is None else self.activation(out)

    def _looped(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """out = act(a op b) by the compiled loop (loops.binary), for float32 operands of out's shape, contiguous,
        into the planned buffer; the job kept for again. False (nothing done) where it does not serve, or while
        it compiles."""
        if self.looped is None or self.loop_act is None or a.shape != b.shape or out.dtype != F32 \
                or not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
            return False
        # The first run, and then operands in the same memory as the last run's (planned buffers), which a repeat
        # needs: binding the loop's job to new ones each run (a step that makes new arrays before it) can take
        # longer than numpy's add of a few thousand values.
        seen, self._seen = self._seen, (memory(a), memory(b))
        if seen is not None and seen != self._seen:
            return False
        job = jit.split("binary", out.size, SLICE_ELEMENTS, a.reshape(-1), b.reshape(-1), out.reshape(-1),
                        self.looped, *self.loop_act)
        if job is None:
            return False
        self._kept = ((a, b), out, job)
        return True

    def again(self, inputs: list[Any]) -> tuple[Callable[[], bool], np.ndarray] | None:
        """The compiled loop's job of the last run, where these are its very operands (replay.py)."""
        return repeat_of(self._kept, inputs, self.out[0])

    def _shared(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, pieces: int) -> None:
        """The op over slices of out along its first axis long enough to share, each slice (and its
        activation) on one of the runtime's threads: numpy holds no GIL over a slice this big. An input
        broadcast along that axis is read whole by every slice."""
        axis = next((i for i, d in enumerate(out.shape) if d >= pieces), int(np.argmax(out.shape)))

        def part(x: np.ndarray, rows: slice) -> np.ndarray:
            at = axis - (out.ndim - x.ndim)
            return x if at < 0 or x.shape[at] == 1 else x[(slice(None),) * at + (rows,)]

        def piece(rows: slice) -> None:
            y = out[(slice(None),) * axis + (rows,)]
            with np.errstate(all="ignore"):
                self.compute(part(a, rows), part(b, rows), y)
            if self.activation is not None:
                self.activation(y)

        parallel_slices(out.shape[axis], pieces, piece)

    def _run_wide(self, a, b, shape, out):
        """Types numpy has no arithmetic for (float16 is computed in float32 too), or mixed types."""
        if a.dtype in ML_INTS or a.dtype == object:
            raise TypeError(f"{self.node.op_type} does not take {a.dtype} inputs")
        wide = compute_dtype(a.dtype)
        with np.errstate(all="ignore"):
            y = self.compute(a.astype(wide, copy=False), b.astype(wide, copy=False), np.empty(shape, wide))
        if self.activation is not None:
            self.activation(y)
        if out is None:
            return y.astype(a.dtype)
        np.copyto(out, y, casting="unsafe")
        return out


def _binary(op_type: str, ufunc: np.ufunc, looped: int | None = None) -> type:
    cls = type(op_type, (Binary,), {"ufunc": ufunc, "looped": looped})
    op(op_type, 1)(cls)
    return cls


Add = _binary("Add", np.add, 0)
Sub = _binary("Sub", np.subtract, 1)
Mul = _binary("Mul", np.multiply, 2)


class Div(Binary):
    ufunc = np.divide

    def compute(self, a, b, out):
        if a.dtype.kind in "iu":
            return _int_div(a, b, out)
        if a.dtype.kind == "b":
            raise TypeError("Div does not take bool inputs")
        return np.divide(a, b, out=out)


op("Div", 1)(Div)


@op("Pow", 1)
def pow_(x, y, broadcast=None, axis=None):
    if broadcast is not None:
        y = legacy_broadcast(x, y, broadcast, axis)
    with np.errstate(all="ignore"):
        if is_float(x.dtype):
            xw = widen(x)
            yw = y.astype(xw.dtype) if is_float(y.dtype) or y.dtype.kind in "iu" else y
            return np.power(xw, yw).astype(x.dtype, copy=False)
        if y.dtype.kind in "iu" and not (y < 0).any():
            return np.power(x, y.astype(x.dtype, copy=False)).astype(x.dtype, copy=False)
        r = np.power(x.astype(np.float64), widen(y).astype(np.float64))
        return r.astype(x.dtype)


@op("Mod", 10)
def mod(a, b, fmod=0):
    with np.errstate(all="ignore"):
        if compute_dtype(a.dtype) != a.dtype:
            return mod(a.astype(F32), b.astype(F32), fmod).astype(a.dtype)
        if fmod:
            return np.fmod(a, b)
        return np.mod(a, b)


@op("BitShift", 11)
def bit_shift(x, y, direction):
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"BitShift direction must be LEFT or RIGHT, got {direction!r}")
    if x.dtype.kind not in "iu":
        raise TypeError(f"BitShift takes integers, not {x.dtype}")
    bits = x.dtype.itemsize * 8
    bad = y >= bits
    if y.dtype.kind == "i":
        bad |= y < 0
    amount = np.where(bad, 0, y).astype(x.dtype)
    if direction == "LEFT":
        r = np.left_shift(x, amount)
        fill = np.zeros((), x.dtype)
    else:
        r = np.right_shift(x, amount)
        fill = np.where(x < 0, x.dtype.type(-1), x.dtype.type(0)) if x.dtype.kind == "i" else np.zeros((), x.dtype)
    if bad.any():
        r = np.where(bad, fill, r)
    return r.astype(x.dtype, copy=False)


# ---------------------------------------------------------------- variadic ops
def _variadic(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], mean: bool = False):
    def compute(*xs, consumed_inputs=None):
        xs = [x for x in xs if x is not None]
        if not xs:
            raise ValueError(f"{name} needs at least one input")
        dt = xs[0].dtype
        with np.errstate(all="ignore"):
            ws = [widen(x) if x.dtype == dt else x.astype(compute_dtype(dt)) for x in xs]
            r = functools.reduce(fn, ws[1:], ws[0])
            if len(ws) == 1:
                r = np.array(r, copy=True)
            if mean:
                if r.dtype.kind in "iu":
                    r = r // len(ws)
                else:
                    r = r / r.dtype.type(len(ws))
        return np.asarray(r).astype(dt, copy=False)

    compute.__name__ = name
    return compute


op("Max", 1)(_variadic("Max", np.maximum))
op("Min", 1)(_variadic("Min", np.minimum))
op("Sum", 1)(_variadic("Sum", np.add))
op("Mean", 1)(_variadic("Mean", np.add, mean=True))
