"""Cast, CastLike and BitCast, between every ONNX tensor type numpy can hold: the ml_dtypes floats
(bfloat16, float8, float4...), the sub-byte integers, strings and bool."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
from onnx import TensorProto

from aiomnn.graph import dtype_of

from ..execution import CpuOp, Unsupported, op
from .dtypes import E8M0, F32, FLOAT8, ML_FLOATS, ML_INTS, is_float


def _to_e8m0(x: np.ndarray, saturate: int, round_mode: str) -> np.ndarray:
    """Round float32 values to powers of two (E8M0 codes are a float32's exponent field)."""
    bits = x.astype(F32).view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.int32)
    m = bits & 0x7FFFFF
    special = e == 0xFF
    if round_mode == "up":
        inc = m != 0
    elif round_mode == "down":
        inc = np.zeros(e.shape, bool)
    elif round_mode == "nearest":
        guard = (m & 0x400000) != 0
        rest = (m & 0x3FFFFF) != 0
        inc = guard & (rest | (e > 0))
    else:
        raise ValueError(f"Cast round_mode must be up, down or nearest, got {round_mode!r}")
    inc &= ~special
    if saturate:
        inc &= e < 0xFE
    code = e + inc
    if saturate:
        code = np.where(special & (m == 0), 0xFE, code)  # +-inf -> the largest value
    else:
        code = np.where((e == 0) & (m == 0), 0xFF, code)  # 0 is below the smallest: NaN
    return code.astype(np.uint8).view(E8M0)


def _parse_number(s: Any, dt: np.dtype) -> Any:
    s = s.decode() if isinstance(s, bytes) else str(s)
    t = s.strip()
    if dt.kind in "iu":
        try:
            return int(t)
        except ValueError:
            return int(float(t))
    if dt.kind == "b":
        low = t.lower()
        if low in ("true", "false"):
            return low == "true"
        return float(t) != 0
    return float(t)


def _to_string(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "1" if v else "0"
    if isinstance(v, (np.floating, float)):
        f = float(v)
        if math.isnan(f):
            return "NaN"
        if math.isinf(f):
            return "INF" if f > 0 else "-INF"
        return "%.8g" % f  # as onnxruntime writes floats
    return str(v)


def cast(x: np.ndarray, to: np.dtype, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    """ONNX Cast of an array to dtype `to`."""
    src = x.dtype
    if src == to:
        return x
    with np.errstate(all="ignore"):
        if to == object:
            return np.array([_to_string(v) for v in x.reshape(-1).tolist()] if src != object else x.reshape(-1),
                            dtype=object).reshape(x.shape)
        if src == object:
            work = np.float64 if to.kind not in "iub" else (to if to.kind != "b" else bool)
            if to in ML_INTS:
                work = np.int64
            vals = [_parse_number(v, np.dtype(work)) for v in x.reshape(-1)]
            return cast(np.array(vals, dtype=work).reshape(x.shape), to, saturate, round_mode)
        if to == E8M0:
            return _to_e8m0(x, saturate, round_mode)
        if src in ML_INTS and to not in ML_INTS:
            x = x.astype(np.int8)
        if to in FLOAT8 and saturate:
            info = ml_dtypes.finfo(to)
            lo, hi = float(info.min), float(info.max)
            if is_float(src):
                w = x.astype(F32) if src in ML_FLOATS else x
                return np.clip(w, lo, hi).astype(to)
            return np.clip(x.astype(np.float64), lo, hi).astype(to)
        if src in ML_FLOATS and to not in ML_FLOATS and to.kind != "f":
            x = x.astype(F32)
        if src.kind == "b" and to in ML_FLOATS | ML_INTS:
            x = x.astype(np.int8)
        return x.astype(to)


def _onnx_dtype(to: Any, where: str) -> np.dtype:
    if isinstance(to, str):  # Cast-1 names the type
        try:
            to = TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise Unsupported(f"unknown type name {to!r}") from None
    return dtype_of(int(to), where)


class Cast(CpuOp):
    def __init__(self, node, inputs, outputs, to, saturate=1, round_mode="up"):
        super().__init__(node, inputs, outputs)
        self.to = _onnx_dtype(to, str(node))
        self.saturate, self.round_mode = saturate, round_mode
        if self.to.kind == "c":
            raise Unsupported("casting to complex types")

    def run(self, x):
        return cast(x, self.to, self.saturate, self.round_mode)


op("Cast", 1)(Cast)


@op("CastLike", 15)
def cast_like(x, like, saturate=1, round_mode="up"):
    return cast(x, like.dtype, saturate, round_mode)


@op("BitCast", 26)
def bit_cast(x, to):
    dt = _onnx_dtype(to, "BitCast")
    if dt.itemsize != x.dtype.itemsize or dt == object or x.dtype == object:
        raise TypeError(f"BitCast from {x.dtype} to {dt}: the bit widths differ")
    return (x if x.flags.c_contiguous else x.copy()).view(dt)
