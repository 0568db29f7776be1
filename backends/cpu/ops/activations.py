"""In-place activations, which fused producers (Conv, ConvTranspose, Gemm, Add) apply to their own
output through activation_fn and the unary ops reuse, and erf to float32 precision (Erf, Gelu)."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

from .. import jit
from ..threads import SLICE_ELEMENTS, shared_scratch
from .dtypes import F32, compute_dtype

F64 = np.dtype(np.float64)

_SQRT_PI_2 = 2.0 / math.sqrt(math.pi)
# Maclaurin series of erf(x)/x in x^2: 2/sqrt(pi) * (-1)^n / (n! (2n+1)); 10 terms reach 1e-13 for |x| < 0.5.
_ERF_TAYLOR = [_SQRT_PI_2 * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(10)][::-1]
# Chebyshev fit of erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2): fractional error below 1.2e-7.
_ERFC_CHEB = [0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
              0.37409196, 1.00002368, -1.26551223]


def _erf64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    # |x| < 0.5: the series; otherwise 1 - erfc, whose error is then at most ~6e-8 absolute.
    s = np.minimum(a, 0.5)
    z = s * s
    p = np.full_like(z, _ERF_TAYLOR[0])
    for c in _ERF_TAYLOR[1:]:
        p *= z
        p += c
    p *= s
    t = 1.0 / (1.0 + 0.5 * a)
    q = np.full_like(t, _ERFC_CHEB[0])
    for c in _ERFC_CHEB[1:]:
        q *= t
        q += c
    q -= a * a
    with np.errstate(over="ignore", invalid="ignore"):
        np.exp(q, out=q)
        q *= t
        big = 1.0 - q
    r = np.where(a < 0.5, p, big)
    return np.copysign(r, x, out=r)


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf to float32 precision (about 1e-7 relative; 3.5e-7 absolute in the compiled float32 loop), for any
    float dtype."""
    if out is not None and out is not x and jit.elementwise("erf", x, out):
        return out
    r = _erf64(x)
    if out is not None:
        np.copyto(out, r, casting="unsafe")
        return out
    return r.astype(x.dtype if x.dtype.kind == "f" else F32)



# ------------------------------------------------------------------ activations
# In-place activations, each a few passes of numpy ufuncs over y (and a scratch temporary). Two numpy
# quirks shape them: np.maximum/np.minimum against a scalar take a slow non-SIMD loop while np.clip with
# both bounds and two-array np.maximum are fast, and a `where=` mask is slower still.
try:  # np.clip's ufunc, without the Python wrapper that costs microseconds per call
    from numpy._core.umath import clip as clip_ufunc
except ImportError:  # numpy < 2
    from numpy.core.umath import clip as clip_ufunc


def _temp(y: np.ndarray) -> np.ndarray:
    return shared_scratch("activation", y.shape, y.dtype)[0]


def relu_(y: np.ndarray) -> np.ndarray:
    return clip_ufunc(y, 0, np.inf, out=y)


def _looped(y: np.ndarray, name: str, **attrs: float) -> bool:
    """y = the activation (op type and attributes, as jit.loop_activation takes them) in place by the compiled
    loop, a pass where numpy takes three or four; False (nothing done) where it cannot serve: other dtypes or
    layouts, or while it compiles."""
    if y.dtype != F32 or not y.flags.c_contiguous or not y.size:
        return False
    act = _loop_code(name, tuple(attrs.items()))
    return act is not None and jit.split("activation", y.size, SLICE_ELEMENTS, y.reshape(-1), *act) is not None


@functools.lru_cache(maxsize=64)
def _loop_code(name: str, attrs: tuple[tuple[str, float], ...]) -> tuple[int, float, float] | None:
    """jit.loop_activation's code, looked up once for each activation and its attributes (a table's lookup takes
    microseconds: a run asks for it at every step)."""
    return jit.loop_activation((name, dict(attrs)))


def sigmoid_(y: np.ndarray) -> np.ndarray:
    if _looped(y, "Sigmoid"):
        return y
    # 1 / (1 + exp(-y)), computed without overflow warnings for large |y|.
    np.negative(y, out=y)
    with np.errstate(over="ignore"):
        np.exp(y, out=y)
    y += 1
    return np.reciprocal(y, out=y)


def swish_(y: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    if _looped(y, "Swish", alpha=alpha):
        return y
    t = _temp(y)
    np.multiply(y, y.dtype.type(-alpha), out=t)
    with np.errstate(over="ignore"):
        np.exp(t, out=t)
    t += 1
    return np.divide(y, t, out=y)


def hard_sigmoid_(y: np.ndarray, alpha: float = 0.2, beta: float = 0.5) -> np.ndarray:
    if _looped(y, "HardSigmoid", alpha=alpha, beta=beta):
        return y
    np.multiply(y, y.dtype.type(alpha), out=y)
    np.add(y, y.dtype.type(beta), out=y)
    return clip_ufunc(y, 0, 1, out=y)


def hard_swish_(y: np.ndarray) -> np.ndarray:
    if _looped(y, "HardSwish"):
        return y
    t = _temp(y)
    np.multiply(y, _SIXTH.get(y.dtype) or y.dtype.type(1 / 6), out=t)
    np.add(t, _HALF.get(y.dtype) or y.dtype.type(0.5), out=t)
    clip_ufunc(t, 0, 1, out=t)
    return np.multiply(y, t, out=y)


_SIXTH = {np.dtype(t): t(1 / 6) for t in (np.float32, np.float64)}
_HALF = {np.dtype(t): t(0.5) for t in (np.float32, np.float64)}


def gelu_(y: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        t = y * y
        t *= y
        t *= 0.044715
        t += y
        t *= math.sqrt(2 / math.pi)
        np.tanh(t, out=t)
    elif approximate == "none":
        if jit.elementwise("gelu", y):
            return y
        t = erf(y * y.dtype.type(1 / math.sqrt(2)))
    else:
        raise ValueError(f"Gelu approximate={approximate!r} is not 'none' or 'tanh'")
    t += 1
    t *= 0.5
    return np.multiply(y, t, out=y)


def leaky_relu_(y: np.ndarray, alpha: float = 0.01) -> np.ndarray:
    t = _temp(y)
    np.multiply(y, y.dtype.type(alpha), out=t)
    if 0 <= alpha <= 1:
        return np.maximum(y, t, out=y)  # max(y, alpha y) is y for y >= 0 and alpha y below
    np.copyto(y, t, where=y < 0)
    return y


def clip_(y: np.ndarray, min: Any = None, max: Any = None) -> np.ndarray:  # noqa: A002
    with np.errstate(over="ignore"):
        if min is not None:
            np.maximum(y, np.asarray(min).astype(y.dtype), out=y)
        if max is not None:
            np.minimum(y, np.asarray(max).astype(y.dtype), out=y)
    return y


def elu_(y: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    neg = y <= 0
    with np.errstate(over="ignore"):
        e = np.expm1(y)
    e *= y.dtype.type(alpha)
    np.copyto(y, e, where=neg)
    return y


def fused_clip_(y: np.ndarray, min: Any = None, max: Any = None) -> np.ndarray:  # noqa: A002
    """Clip as fused: an omitted bound is the type's limit (Clip-6 defaults, Clip-11 semantics)."""
    info = np.finfo(y.dtype) if y.dtype.kind == "f" else np.iinfo(y.dtype)
    with np.errstate(over="ignore"):
        lo = np.asarray(info.min if min is None else min).astype(y.dtype)
        hi = np.asarray(info.max if max is None else max).astype(y.dtype)
    return clip_ufunc(y, lo, hi, out=y)


#: In-place activations, by op type, taking the op's attributes: what fused producers apply.
ACTIVATIONS: dict[str, Callable[..., np.ndarray]] = {
    "Relu": relu_,
    "LeakyRelu": leaky_relu_,
    "Clip": fused_clip_,
    "Sigmoid": sigmoid_,
    "HardSigmoid": hard_sigmoid_,
    "HardSwish": hard_swish_,
    "Swish": swish_,
    "Tanh": lambda y: np.tanh(y, out=y),
    "Gelu": gelu_,
    "Elu": elu_,
}


def _then_affine(fn: Callable[[np.ndarray], Any] | None, scale: float, shift: float, y: np.ndarray) -> np.ndarray:
    """fn (if any), then y * scale + shift, in place: a Mul and an Add by scalars fused after an activation."""
    if fn is not None:
        fn(y)
    np.multiply(y, y.dtype.type(scale), out=y)
    return np.add(y, y.dtype.type(shift), out=y)


#: Activations run over a large output in pieces of this many elements (512 KiB of float32), so that their
#: passes stay in the L2 cache. Each numpy call lets go of the GIL, and two runs on two threads queue for it at
#: every short call: on the 2-core test machine, cls at batch 16 with two sessions at once made 868-898 items/s
#: in pieces of 1 << 15, 997-1003 in pieces of 1 << 17; one session and batch 1 (benchmarks/cpu_vs_ort.py, all
#: four models) did not change.
CHUNK = 1 << 17


def activation_fn(activation: tuple[str, dict[str, Any]] | None,
                  affine: tuple[float, float] | None = None) -> Callable[[np.ndarray], np.ndarray] | None:
    """A fused activation (op type, attributes), then y * scale + shift where affine is (scale, shift), as one
    in-place function of an output: float16 and bfloat16 compute in float32, large contiguous outputs go in
    cache-sized pieces. None for neither."""
    if activation is None and affine is None:
        return None
    fn: Callable[[np.ndarray], np.ndarray] | None = None
    if activation is not None:
        name, attrs = activation
        fn = functools.partial(ACTIVATIONS[name], **attrs) if attrs else ACTIVATIONS[name]
    if affine is not None:
        fn = functools.partial(_then_affine, fn, *affine)

    def apply(y: np.ndarray) -> np.ndarray:
        if y.size <= CHUNK and (y.dtype is F32 or y.dtype is F64):  # most calls: no lookups on the way
            return fn(y)
        if compute_dtype(y.dtype) != y.dtype:
            np.copyto(y, fn(y.astype(F32)), casting="unsafe")
            return y
        if y.size <= CHUNK or not y.flags.c_contiguous:
            return fn(y)
        flat = y.reshape(-1)
        for i in range(0, flat.size, CHUNK):
            fn(flat[i:i + CHUNK])
        return y

    return apply
