"""Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, and the
integer/quantized products QLinearMatMul, MatMulInteger, QLinearConv and ConvInteger.

Sub-byte and float8/float6/float4 types are ml_dtypes dtypes (what onnx's
numpy_helper produces). Integer products are computed exactly in float64
(every partial sum stays below 2**53 for any realistic size) and then
wrapped to int32 the way a 32-bit accumulator would.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from aiomnn.graph import dtype_of

from ..execution import CpuOp, Unsupported, op

F32 = np.dtype(np.float32)
_LOW_FLOATS = {np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2,
                                     ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn,
                                     ml_dtypes.float6_e3m2fn, ml_dtypes.float8_e8m0fnu)}
_SATURATING_FLOAT8 = {np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
                                            ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz)}
_INTS = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, ml_dtypes.int4, ml_dtypes.uint4,
                               ml_dtypes.int2, ml_dtypes.uint2)}
_HALF = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


def _int_range(dtype: np.dtype) -> tuple[int, int]:
    info = ml_dtypes.iinfo(dtype) if dtype.kind == "V" else np.iinfo(dtype)
    return int(info.min), int(info.max)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype in _LOW_FLOATS or dtype == np.dtype(ml_dtypes.bfloat16)


def _as_values(a: np.ndarray) -> np.ndarray:
    """A quantized tensor's values, exactly, as float32 (float types) or int64 (integer types)."""
    return a.astype(np.float32) if _is_float(a.dtype) else a.astype(np.int64)


def _expand(p: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int, what: str) -> np.ndarray:
    """Broadcast a scale or zero point to x's shape: per tensor, per axis, or blocked."""
    p = np.asarray(p)
    rank = len(shape)
    if p.ndim == 0 or (p.size == 1 and p.ndim == 1 and block_size <= 0):
        return p.reshape(())
    if rank == 0:
        raise ValueError(f"{what} of shape {p.shape} for a scalar input")
    ax = axis + rank if axis < 0 else axis
    if not 0 <= ax < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    if block_size > 0:
        if p.ndim != rank:
            raise ValueError(f"blocked {what} must have rank {rank}, got shape {p.shape}")
        d = shape[ax]
        if p.shape[ax] != -(-d // block_size) or any(p.shape[i] != shape[i] for i in range(rank) if i != ax):
            raise ValueError(f"blocked {what} shape {p.shape} does not fit input {shape} "
                             f"with block_size {block_size} on axis {ax}")
        return np.repeat(p, block_size, axis=ax)[(slice(None),) * ax + (slice(0, d),)]
    if p.ndim == 1:
        if p.shape[0] != shape[ax]:
            raise ValueError(f"per-axis {what} has {p.shape[0]} values, axis {ax} of {shape} has {shape[ax]}")
        return p.reshape((1,) * ax + (-1,) + (1,) * (rank - ax - 1))
    raise ValueError(f"{what} of shape {p.shape} needs block_size for input {shape}")


def _round_to(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float32 values rounded to dtype's precision, kept as float32 (exact emulation of half/bfloat16 arithmetic)."""
    return a.astype(dtype).astype(np.float32) if dtype in _HALF else a


def _saturate_cast(q: np.ndarray, out: np.dtype, saturate: bool = True) -> np.ndarray:
    """Round-half-even values (float) into a quantized dtype, saturating as QuantizeLinear does."""
    if out in _INTS:
        lo, hi = _int_range(out)
        with np.errstate(invalid="ignore"):  # NaN has no integer value; it becomes whatever the cast gives
            return np.clip(np.rint(q), lo, hi).astype(out)
    if out in _LOW_FLOATS:
        q = q.astype(np.float32, copy=False)
        if saturate and out in _SATURATING_FLOAT8:
            m = float(ml_dtypes.finfo(out).max)
            q = np.clip(q, -m, m)
        return q.astype(out)
    return q.astype(out)


def quantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, axis: int, block_size: int,
             out_dtype: np.dtype, saturate: bool = True, precision: np.dtype | None = None) -> np.ndarray:
    s = _expand(scale, x.shape, axis, block_size, "scale")
    comp = precision if precision is not None else s.dtype
    if comp in _HALF or comp == F32 or comp in _LOW_FLOATS:
        xs = _round_to(x.astype(np.float32), comp)
        q = _round_to(xs / _round_to(s.astype(np.float32), comp), comp)
    else:
        q = x.astype(np.float64) / s.astype(np.float64)
    if out_dtype in _INTS:
        q = np.rint(q)
        if zero_point is not None:
            q = q + _expand(zero_point, x.shape, axis, block_size, "zero point").astype(np.int64)
        return _saturate_cast(q, out_dtype, saturate)
    if zero_point is not None:
        q = q + _expand(zero_point, x.shape, axis, block_size, "zero point").astype(np.float32)
    return _saturate_cast(q, out_dtype, saturate)


def dequantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, axis: int, block_size: int,
               out_dtype: np.dtype) -> np.ndarray:
    """(x - zero_point) * scale, exact in float64 (both factors have at most 32 significant bits), rounded
    once to the output type, as onnxruntime does."""
    v = _as_values(x)
    if zero_point is not None:
        v = v - _as_values(_expand(zero_point, x.shape, axis, block_size, "zero point"))
    s = _expand(scale, x.shape, axis, block_size, "scale").astype(np.float64)
    return (v.astype(np.float64) * s).astype(out_dtype)


@op("QuantizeLinear", 10)
class QuantizeLinear(CpuOp):
    #: Before opset 23 the spec does not tie the division's precision to the scale's type;
    #: it is done in float32, as onnxruntime does. From 23 on, the scale's type (or `precision`) rules.
    typed_division = False

    def __init__(self, node, inputs, outputs, *, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
        super().__init__(node, inputs, outputs)
        self.axis, self.saturate, self.block_size = axis, bool(saturate), block_size
        self.output_dtype = dtype_of(output_dtype, str(node)) if output_dtype else None
        self.precision = dtype_of(precision, str(node)) if precision else None
        if block_size < 0:
            raise Unsupported(f"block_size {block_size}")

    def run(self, x, y_scale, y_zero_point=None):
        out = self.output_dtype
        if y_zero_point is not None:
            if out is not None and out != y_zero_point.dtype:
                raise ValueError(f"output_dtype {out} differs from the zero point's type {y_zero_point.dtype}")
            out = y_zero_point.dtype
        if out is None:
            out = np.dtype(np.uint8)
        if out not in _INTS and out not in _LOW_FLOATS:
            raise ValueError(f"cannot quantize to {out}")
        precision = self.precision
        if precision is None and not self.typed_division:
            precision = F32
        return quantize(x, y_scale, y_zero_point, self.axis, self.block_size, out, self.saturate, precision)


@op("QuantizeLinear", 23)
class QuantizeLinear23(QuantizeLinear):
    typed_division = True


@op("DequantizeLinear", 10)
class DequantizeLinear(CpuOp):
    def __init__(self, node, inputs, outputs, *, axis=1, block_size=0, output_dtype=0):
        super().__init__(node, inputs, outputs)
        self.axis, self.block_size = axis, block_size
        self.output_dtype = dtype_of(output_dtype, str(node)) if output_dtype else None
        if block_size < 0:
            raise Unsupported(f"block_size {block_size}")

    def run(self, x, x_scale, x_zero_point=None):
        out = self.output_dtype
        if out is None:
            out = x_scale.dtype if x_scale.dtype.kind == "f" or x_scale.dtype in _HALF else F32
        return dequantize(x, x_scale, x_zero_point, self.axis, self.block_size, out)


@op("DynamicQuantizeLinear", 11)
def dynamic_quantize_linear(x):
    x32 = x.astype(np.float32, copy=False)
    lo = min(0.0, float(x32.min())) if x32.size else 0.0
    hi = max(0.0, float(x32.max())) if x32.size else 0.0
    scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255))
    if scale == 0 or not np.isfinite(scale):
        if not np.isfinite(scale):
            raise ValueError("DynamicQuantizeLinear: the input holds a non-finite value")
        return np.zeros(x.shape, np.uint8), np.array(scale, np.float32), np.array(0, np.uint8)
    zp = np.clip(np.rint(np.float32(0) - np.float32(lo) / scale), 0, 255).astype(np.uint8)
    y = np.clip(np.rint(x32 / scale) + zp.astype(np.float32), 0, 255).astype(np.uint8)
    return y, np.array(scale, np.float32), np.array(zp, np.uint8)


# Integer products --------------------------------------------------------------

def _wrap_int32(a: np.ndarray) -> np.ndarray:
    """Exact integer values (as float64) into int32, wrapping like a 32-bit accumulator."""
    return np.rint(a).astype(np.int64).astype(np.int32)


def _row_param(p: np.ndarray | None, a: np.ndarray) -> np.ndarray | None:
    """A's per-row parameter: a 1-D vector of M values means one per row (shape M x 1)."""
    if p is None:
        return None
    p = np.asarray(p)
    if p.ndim == 1 and p.size > 1:
        return p.reshape(-1, 1)
    if p.ndim == 1 and p.size == 1:
        return p.reshape(())
    return p


def _col_param(p: np.ndarray | None) -> np.ndarray | None:
    if p is None:
        return None
    p = np.asarray(p)
    return p.reshape(()) if p.size == 1 and p.ndim <= 1 else p


def _int_matmul(a, b, a_zero_point=None, b_zero_point=None) -> np.ndarray:
    av = a.astype(np.float64)
    bv = b.astype(np.float64)
    if a_zero_point is not None:
        av = av - _row_param(a_zero_point, a).astype(np.float64)
    if b_zero_point is not None:
        bv = bv - _col_param(b_zero_point).astype(np.float64)
    return np.matmul(av, bv)


@op("MatMulInteger", 10)
def matmul_integer(A, B, a_zero_point=None, b_zero_point=None):
    return _wrap_int32(_int_matmul(A, B, a_zero_point, b_zero_point))


def _requantize(acc: np.ndarray, multiplier: np.ndarray, y_zero_point: np.ndarray) -> np.ndarray:
    """acc * multiplier, rounded half to even, plus the zero point, saturated to its type."""
    zp = np.asarray(y_zero_point)
    q = np.rint(acc * multiplier) + zp.reshape(()).astype(np.float64) if zp.size == 1 else \
        np.rint(acc * multiplier) + zp.astype(np.float64)
    return _saturate_cast(q, zp.dtype)


@op("QLinearMatMul", 10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    acc = _int_matmul(a, b, a_zero_point, b_zero_point)
    as_ = _row_param(a_scale, a).astype(np.float64)
    bs = _col_param(b_scale).astype(np.float64)
    ys = _col_param(y_scale).astype(np.float64)
    # Real value: acc * as * bs; quantized: / ys. Computed in float32 as runtimes do.
    real = (acc.astype(np.float32) * as_.astype(np.float32)) * bs.astype(np.float32)
    return _requantize(real / ys.astype(np.float32), np.float32(1), y_zero_point)


def conv_nd(x: np.ndarray, w: np.ndarray, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
            pads=None, strides=None) -> np.ndarray:
    """Plain N-D convolution (float64 in, float64 out) by im2col; x is (N, C, *S), w is (M, C/group, *K)."""
    nd = x.ndim - 2
    if nd < 1:
        raise ValueError(f"convolution input must have rank >= 3, got shape {x.shape}")
    ks = tuple(w.shape[2:])
    if kernel_shape is not None and tuple(kernel_shape) != ks:
        raise ValueError(f"kernel_shape {kernel_shape} does not match the weights {w.shape}")
    strides = list(strides or [1] * nd)
    dil = list(dilations or [1] * nd)
    sp = x.shape[2:]
    span = [d * (k - 1) + 1 for d, k in zip(dil, ks)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            out = -(-sp[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + span[i] - sp[i])
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
    elif auto_pad == "VALID":
        begin, end = [0] * nd, [0] * nd
    elif auto_pad == "NOTSET":
        p = list(pads or [0] * (2 * nd))
        begin, end = p[:nd], p[nd:]
    else:
        raise ValueError(f"auto_pad {auto_pad!r}")
    N, C = x.shape[:2]
    M = w.shape[0]
    if C % group or M % group or w.shape[1] != C // group:
        raise ValueError(f"input {x.shape} and weights {w.shape} do not fit group={group}")
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)))
    outs = [(xp.shape[2 + i] - span[i]) // strides[i] + 1 for i in range(nd)]
    if any(o <= 0 for o in outs):
        raise ValueError(f"convolution output would be empty: input {x.shape}, kernel {ks}")
    v = np.lib.stride_tricks.sliding_window_view(xp, span, axis=tuple(range(2, 2 + nd)))
    v = v[(slice(None),) * 2 + tuple(slice(0, o * s, s) for o, s in zip(outs, strides))
          + tuple(slice(None, None, d) for d in dil)]
    P, K = math.prod(outs), math.prod(ks)
    cg, mg = C // group, M // group
    cols = v.reshape(N, group, cg, P, K).transpose(0, 1, 3, 2, 4).reshape(N, group, P, cg * K)
    wm = w.reshape(group, mg, cg * K).transpose(0, 2, 1)  # (G, cg*K, mg)
    y = np.matmul(cols, wm)  # (N, G, P, mg)
    return y.transpose(0, 1, 3, 2).reshape(N, M, *outs)


def _per_channel(p: np.ndarray | None, ndim: int) -> np.ndarray | None:
    if p is None:
        return None
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    return p.reshape((-1,) + (1,) * (ndim - 1))


@op("ConvInteger", 10)
class ConvInteger(CpuOp):
    def __init__(self, node, inputs, outputs, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 pads=None, strides=None):
        super().__init__(node, inputs, outputs)
        self.attrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                          pads=pads, strides=strides)

    def run(self, x, w, x_zero_point=None, w_zero_point=None):
        xv = x.astype(np.float64)
        wv = w.astype(np.float64)
        if x_zero_point is not None:
            xv = xv - np.asarray(x_zero_point).reshape(()).astype(np.float64) if np.size(x_zero_point) == 1 else \
                xv - np.asarray(x_zero_point, np.float64).reshape((1, -1) + (1,) * (x.ndim - 2))
        if w_zero_point is not None:
            wv = wv - _per_channel(w_zero_point, w.ndim).astype(np.float64)
        return _wrap_int32(conv_nd(xv, wv, **self.attrs))


@op("QLinearConv", 10)
class QLinearConv(ConvInteger):
    def run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None):
        acc = _wrap_int32(conv_nd(x.astype(np.float64) - np.asarray(x_zero_point).astype(np.float64).reshape(()),
                                  w.astype(np.float64) - _per_channel(w_zero_point, w.ndim).astype(np.float64),
                                  **self.attrs))
        acc = acc.astype(np.int64)
        if B is not None:
            acc = acc + np.asarray(B).astype(np.int64).reshape((1, -1) + (1,) * (x.ndim - 2))
        ws = np.asarray(w_scale, np.float32)
        ws = ws.reshape(()) if ws.size == 1 else ws.reshape((1, -1) + (1,) * (x.ndim - 2))
        mult = (np.float32(np.asarray(x_scale).reshape(())) * ws) / np.float32(np.asarray(y_scale).reshape(()))
        return _requantize(acc.astype(np.float64), mult.astype(np.float64), y_zero_point)
