"""Elementwise ops of one input: unary math, activations (PRelu's slope and SwiGLU's gate beside them),
Clip, and Identity and inference Dropout, which pass their input through. The broadcasting arithmetic of two
or more inputs is in elementwise.py, Cast in cast.py, and the in-place activations that fused producers
apply in activations.py.

Float ops write into planned buffers (`out=`), so activations reuse memory
and a run allocates little. float16 and the ml_dtypes floats (bfloat16,
float8...) are computed in float32 and rounded once at the end (dtypes.py).
"""

from __future__ import annotations

from typing import Any, Callable

import ml_dtypes
import numpy as np

from aiomnn.unary import CHOICES, FLT_MAX, TABLE, VERSIONS

from ..execution import CpuOp, Unsupported, op
from .activations import (clip_, clip_ufunc, elu_, erf, gelu_, hard_sigmoid_, hard_swish_, leaky_relu_, sigmoid_,
                          swish_)
from .dtypes import BOOL, F16, F32, ML_INTS, compute_dtype, is_float, matches, widen


# ------------------------------------------------------------------ unary math
class Elementwise(CpuOp):
    """One input, one output of the same shape; compute(x, out, **attrs) fills out and returns it."""

    writes_outputs = True
    defaults: dict[str, Any] = {}
    out_bool = False

    def __init__(self, node, inputs, outputs, **attrs):
        super().__init__(node, inputs, outputs)
        attrs.pop("consumed_inputs", None)
        extra = sorted(set(attrs) - set(self.defaults))
        if extra:
            raise Unsupported(f"attribute(s) {', '.join(extra)} not supported")
        self.attrs = {**self.defaults, **attrs}

    @staticmethod
    def compute(x: np.ndarray, out: np.ndarray, **attrs: Any) -> np.ndarray:
        raise NotImplementedError

    def run(self, x):
        if x.dtype == object or x.dtype in ML_INTS:
            raise TypeError(f"{self.node.op_type} does not take {x.dtype} input")
        dt = BOOL if self.out_bool else x.dtype
        out = matches(self.out[0], x.shape, dt)
        wide = compute_dtype(x.dtype)
        with np.errstate(all="ignore"):
            if wide != x.dtype:
                r = self.compute(x.astype(wide), np.empty(x.shape, BOOL if self.out_bool else wide), **self.attrs)
                if out is None:
                    return r.astype(dt)
                np.copyto(out, r, casting="unsafe")
                return out
            if out is None:
                out = np.empty(x.shape, dt)
            return self.compute(x, out, **self.attrs)


def unary(op_type: str, since: int | tuple[int, ...], compute: Callable[..., np.ndarray], out_bool: bool = False,
          **defaults: Any) -> type:
    cls = type(op_type, (Elementwise,), {"compute": staticmethod(compute), "defaults": defaults,
                                         "out_bool": out_bool})
    for v in (since,) if isinstance(since, int) else since:
        op(op_type, v)(cls)
    return cls


def _ufunc(f: np.ufunc) -> Callable[..., np.ndarray]:
    return lambda x, out: f(x, out=out)


def table_op(name: str, compute: Callable[..., np.ndarray]) -> None:
    """compute registered for op `name` of aiomnn.unary: for each version, from its opset, with its attributes
    and their defaults (VERSIONS and CHOICES); an op without attributes from its table row's opset."""
    versions = VERSIONS.get(name) or ((TABLE[name].since, ()),)
    choices = {attr: default for attr, (default, _) in CHOICES.get(name, {}).items()}
    for since, attrs in versions:
        unary(name, since, compute, **dict(attrs), **choices)


for _name, _f in (
        ("Abs", np.abs), ("Neg", np.negative), ("Sqrt", np.sqrt), ("Exp", np.exp), ("Log", np.log),
        ("Reciprocal", np.reciprocal), ("Floor", np.floor), ("Ceil", np.ceil), ("Round", np.rint),
        ("Sign", np.sign), ("Sin", np.sin), ("Cos", np.cos), ("Tan", np.tan), ("Asin", np.arcsin),
        ("Acos", np.arccos), ("Atan", np.arctan), ("Sinh", np.sinh), ("Cosh", np.cosh), ("Asinh", np.arcsinh),
        ("Acosh", np.arccosh), ("Atanh", np.arctanh), ("Tanh", np.tanh)):
    table_op(_name, _ufunc(_f))
unary("IsNaN", 9, _ufunc(np.isnan), out_bool=True)


def _erf_op(x, out):
    return erf(x, out)


table_op("Erf", _erf_op)


def _is_inf(x, out, detect_negative=1, detect_positive=1):
    if x.dtype.kind in "iub":
        out[...] = False
        return out
    if detect_negative and detect_positive:
        return np.isinf(x, out=out)
    if detect_positive:
        return np.isposinf(x, out=out)
    if detect_negative:
        return np.isneginf(x, out=out)
    out[...] = False
    return out


unary("IsInf", 10, _is_inf, out_bool=True, detect_negative=1, detect_positive=1)


def _relu(x, out):
    if x.dtype.kind == "f":
        return clip_ufunc(x, 0, np.inf, out=out)
    return np.maximum(x, x.dtype.type(0), out=out)


def _leaky_relu(x, out, alpha):
    np.copyto(out, x)
    return leaky_relu_(out, alpha)


def _elu(x, out, alpha):
    np.copyto(out, x)
    return elu_(out, alpha)


def _selu(x, out, alpha, gamma):
    np.copyto(out, x)
    elu_(out, alpha)
    return np.multiply(out, x.dtype.type(gamma), out=out)


def _celu(x, out, alpha):
    a = x.dtype.type(alpha)
    np.divide(x, a, out=out)
    np.expm1(out, out=out)
    out *= a
    np.minimum(out, 0, out=out)
    out += np.maximum(x, 0)
    return out


def _thresholded_relu(x, out, alpha):
    out[...] = 0
    np.copyto(out, x, where=x > x.dtype.type(alpha))
    return out


def _in_place(fn):
    def compute(x, out, **attrs):
        np.copyto(out, x)
        return fn(out, **attrs)

    return compute


def _softplus(x, out):
    return np.logaddexp(x.dtype.type(0), x, out=out)


def _softsign(x, out):
    np.abs(x, out=out)
    out += 1
    return np.divide(x, out, out=out)


def _mish(x, out):
    np.logaddexp(x.dtype.type(0), x, out=out)
    np.tanh(out, out=out)
    return np.multiply(x, out, out=out)


def _swish(x, out, alpha):
    np.copyto(out, x)
    return swish_(out, alpha)


def _shrink(x, out, lambd, bias):
    if x.dtype.kind in "iu":
        y = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
        np.copyto(out, y, casting="unsafe")
        return out
    out[...] = 0
    np.copyto(out, x + x.dtype.type(bias), where=x < -lambd)
    np.copyto(out, x - x.dtype.type(bias), where=x > lambd)
    return out


table_op("Relu", _relu)
table_op("LeakyRelu", _leaky_relu)
table_op("Elu", _elu)
table_op("Selu", _selu)
table_op("Celu", _celu)
table_op("ThresholdedRelu", _thresholded_relu)
table_op("Sigmoid", _in_place(sigmoid_))
table_op("HardSigmoid", _in_place(hard_sigmoid_))
table_op("HardSwish", _in_place(hard_swish_))
table_op("Softplus", _softplus)
table_op("Softsign", _softsign)
table_op("Mish", _mish)
table_op("Swish", _swish)
table_op("Gelu", _in_place(gelu_))
table_op("Shrink", _shrink)


@op("SwiGLU", 28)
def swiglu(a, b, alpha=1.0):
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"SwiGLU takes A and B of one shape and dtype, got {a.dtype}{a.shape} and {b.dtype}{b.shape}")
    with np.errstate(all="ignore"):
        w = widen(a)
        y = _swish(w, np.empty(w.shape, w.dtype), alpha)
        y *= widen(b)
    return y.astype(a.dtype, copy=False)


@op("PRelu", 7)
def prelu(x, slope):
    if compute_dtype(x.dtype) != x.dtype:
        return prelu(x.astype(F32), slope.astype(F32)).astype(x.dtype)
    slope = slope.astype(x.dtype, copy=False)
    return np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)


@op("PRelu", 1)
def prelu_1(x, slope, consumed_inputs=None):
    # Before opset 7 a slope of C values applies per channel (axis 1).
    if slope.ndim == 1 and slope.size > 1 and x.ndim >= 2 and slope.size == x.shape[1]:
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return prelu(x, slope)


# ----------------------------------------------------------------------- Clip
def _clip(x: np.ndarray, lo: Any, hi: Any) -> np.ndarray:
    if compute_dtype(x.dtype) != x.dtype and x.dtype != F16:
        return _clip(x.astype(F32), lo, hi).astype(x.dtype)
    y = np.array(x, copy=True)
    return clip_(y, lo, hi)


@op("Clip", 1)
def clip_1(x, min=None, max=None, consumed_inputs=None):  # noqa: A002
    return _clip(x, min, max)


@op("Clip", 6)
def clip_6(x, min=-FLT_MAX, max=FLT_MAX):  # noqa: A002
    return _clip(x, min, max)


@op("Clip", 11)
def clip_11(x, lo=None, hi=None):
    for b in (lo, hi):
        if b is not None and np.size(b) != 1:
            raise ValueError(f"Clip bounds must be scalars, got shape {np.shape(b)}")
    # An omitted bound is the type's lowest or highest value, so +-inf clamp to the finite range.
    if lo is None and is_float(x.dtype):
        lo = np.array(ml_dtypes.finfo(x.dtype).min)
    if hi is None and is_float(x.dtype):
        hi = np.array(ml_dtypes.finfo(x.dtype).max)
    return _clip(x, None if lo is None else lo.reshape(()), None if hi is None else hi.reshape(()))


# -------------------------------------------------------------------- Dropout
class Dropout(CpuOp):
    """Inference Dropout: the identity, with an all-true mask. Training mode needs random draws: refused."""

    def __init__(self, node, inputs, outputs, ratio=0.5, is_test=None, seed=None, consumed_inputs=None):
        super().__init__(node, inputs, outputs)
        self.ratio = ratio
        self.mask = len(node.outputs) > 1 and bool(node.outputs[1])
        self.mask_bool = node.opset >= 10
        if node.opset < 7 and is_test == 0 and ratio > 0:
            raise Unsupported("Dropout in training mode (is_test=0) draws random masks")

    def run(self, x, ratio=None, training_mode=None):
        if training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0]):
            r = self.ratio if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
            if r != 0:
                raise ValueError("Dropout with training_mode=True and a nonzero ratio draws random masks: "
                                 "not supported")
        if not self.mask:
            return x
        return x, np.ones(x.shape, dtype=BOOL if self.mask_bool else x.dtype)


op("Dropout", 1)(Dropout)


# ------------------------------------------------------------------- Identity
@op("Identity", 1)
def identity(x):
    if isinstance(x, list):
        return list(x)
    return x
