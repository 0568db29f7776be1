"""Elementwise ops: unary math, activations, and broadcasting binary arithmetic.

Float ops write into planned buffers (`out=`), so activations reuse memory
and a run allocates little. Activations are also kept in ACTIVATIONS, in-place
forms that fused producers (Conv, Gemm, Add) apply to their own output.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from ..kernel import Kernel, op


def _erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf to float32 precision (Abramowitz-Stegun 7.1.26 is too coarse; use math.erf vectorised)."""
    r = _ERF(x).astype(x.dtype, copy=False)
    if out is not None:
        out[...] = r
        return out
    return r


_ERF = np.vectorize(math.erf, otypes=[np.float64])


def hard_sigmoid_(y: np.ndarray, alpha: float = 0.2, beta: float = 0.5) -> np.ndarray:
    np.multiply(y, alpha, out=y)
    np.add(y, beta, out=y)
    return np.clip(y, 0, 1, out=y)


def hard_swish_(y: np.ndarray) -> np.ndarray:
    t = np.add(y, 3.0, dtype=y.dtype)
    np.clip(t, 0, 6, out=t)
    t *= 1 / 6
    return np.multiply(y, t, out=y)


def sigmoid_(y: np.ndarray) -> np.ndarray:
    # 1 / (1 + exp(-y)), computed without overflow warnings for large |y|.
    np.negative(y, out=y)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    y += 1
    return np.reciprocal(y, out=y)


def gelu_(y: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        t = y * y * y
        t *= 0.044715
        t += y
        t *= math.sqrt(2 / math.pi)
        np.tanh(t, out=t)
    else:
        t = _erf(y / math.sqrt(2))
    t += 1
    t *= 0.5
    return np.multiply(y, t, out=y)


#: In-place activations, by op type, taking the op's attributes: what fused producers apply.
ACTIVATIONS: dict[str, Callable[..., np.ndarray]] = {
    "Relu": lambda y: np.maximum(y, 0, out=y),
    "LeakyRelu": lambda y, alpha=0.01: np.multiply(y, np.where(y < 0, y.dtype.type(alpha), y.dtype.type(1)), out=y),
    "Clip": lambda y, min=None, max=None: np.clip(y, min, max, out=y),
    "Sigmoid": sigmoid_,
    "HardSigmoid": hard_sigmoid_,
    "HardSwish": hard_swish_,
    "Tanh": lambda y: np.tanh(y, out=y),
    "Gelu": gelu_,
}


def apply_activation(y: np.ndarray, activation: tuple[str, dict[str, Any]] | None) -> np.ndarray:
    if activation is None:
        return y
    name, attrs = activation
    return ACTIVATIONS[name](y, **attrs)


class Unary(Kernel):
    """An elementwise op with one input that writes its planned output buffer."""

    writes_outputs = True

    def run(self, x):
        out = self.out[0]
        if out is None or x.dtype != out.dtype:
            out = np.empty_like(x)
        np.copyto(out, x)
        return self.apply(out)

    def apply(self, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def _unary(op_type: str, since: int, fn: Callable[..., np.ndarray]) -> None:
    """Register an activation under its op type, with its attributes bound at creation."""

    class _Op(Unary):
        def __init__(self, node, inputs, outputs, **attrs):
            super().__init__(node, inputs, outputs)
            self.attrs = attrs

        def apply(self, y):
            return fn(y, **self.attrs)

    _Op.__name__ = op_type
    op(op_type, since)(_Op)


_unary("Relu", 6, ACTIVATIONS["Relu"])
_unary("LeakyRelu", 6, ACTIVATIONS["LeakyRelu"])
_unary("Sigmoid", 6, sigmoid_)
_unary("HardSigmoid", 6, hard_sigmoid_)
_unary("HardSwish", 14, hard_swish_)
_unary("Tanh", 6, ACTIVATIONS["Tanh"])
_unary("Gelu", 20, gelu_)


@op("Clip", 6)
def clip_6(x, min=-3.4028234663852886e38, max=3.4028234663852886e38):
    return np.clip(x, x.dtype.type(min), x.dtype.type(max))


@op("Clip", 11)
def clip_11(x, lo=None, hi=None):
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return np.array(x, copy=True) if lo is None and hi is None else x


for _name, _ufunc in (("Sqrt", np.sqrt), ("Exp", np.exp), ("Log", np.log), ("Abs", np.abs), ("Neg", np.negative),
                      ("Floor", np.floor), ("Ceil", np.ceil), ("Reciprocal", np.reciprocal), ("Sin", np.sin),
                      ("Cos", np.cos), ("Tan", np.tan), ("Sign", np.sign), ("Round", np.round)):
    op(_name, 6 if _name not in ("Sin", "Cos", "Tan", "Sign", "Round") else 7)(lambda x, _f=_ufunc: _f(x))


@op("Erf", 9)
def erf(x):
    return _erf(x)


class Binary(Kernel):
    """A broadcasting binary op. Writes into its planned buffer when the dtypes agree."""

    writes_outputs = True
    ufunc: np.ufunc

    def __init__(self, node, inputs, outputs, **attrs):
        super().__init__(node, inputs, outputs)
        self.activation = attrs.get("_activation")

    def run(self, a, b):
        out = self.out[0]
        if out is not None and out.dtype == a.dtype == b.dtype:
            y = self.ufunc(a, b, out=out)
        else:
            y = self.ufunc(a, b)
            if y.dtype != a.dtype:
                y = y.astype(a.dtype)
        return apply_activation(y, self.activation) if self.activation else y


def _binary(op_type: str, since: int, ufunc: np.ufunc) -> None:
    _Op = type(op_type, (Binary,), {"ufunc": ufunc})
    op(op_type, since)(_Op)


_binary("Add", 7, np.add)
_binary("Sub", 7, np.subtract)
_binary("Mul", 7, np.multiply)


@op("Div", 7)
class Div(Binary):
    def run(self, a, b):
        if a.dtype.kind in "iu":
            with np.errstate(divide="ignore"):
                q = np.trunc(a / b).astype(a.dtype)
            return q
        return super().run(a, b)

    ufunc = np.divide


@op("Pow", 7)
def pow_(x, y):
    if x.dtype.kind == "f":
        return np.power(x, y.astype(x.dtype, copy=False))
    return np.power(x, y.astype(np.int64)).astype(x.dtype)


@op("Equal", 7)
def equal(a, b):
    return np.equal(a, b)


@op("Where", 9)
def where(c, x, y):
    return np.where(c, x, y)
