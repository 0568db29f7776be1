"""The dtypes CPU kernels compute in, and the checks they share: float16 and the ml_dtypes floats
(bfloat16, float8...) compute in float32 and round once at the end."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np


def _ml(*names: str) -> frozenset[np.dtype]:
    return frozenset(np.dtype(getattr(ml_dtypes, n)) for n in names if hasattr(ml_dtypes, n))


#: Float types numpy has no native arithmetic for: computed in float32.
ML_FLOATS = _ml("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                "float8_e8m0fnu", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")
#: Sub-byte integer types.
ML_INTS = _ml("int4", "uint4", "int2", "uint2")
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
BOOL = np.dtype(bool)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
#: float8 types that Cast saturates (E8M0 has its own rounding rules).
FLOAT8 = _ml("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def same(a: Any, b: Any) -> bool:
    """Whether a and b are one array, or arrays over the same memory alike in shape, strides and dtype (a view
    that a Reshape makes anew each run): a step that bound its work to a's memory may repeat it for b."""
    return a is b or (type(a) is np.ndarray and type(b) is np.ndarray and a.shape == b.shape
                      and a.strides == b.strides and a.dtype == b.dtype and a.ctypes.data == b.ctypes.data)


def memory(a: np.ndarray) -> tuple:
    """Where an array's values are (address, shape, strides, dtype): what same() compares, kept without the array."""
    return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype


def repeat_of(kept: tuple | None, inputs: list[Any], planned: Any) -> tuple[Any, Any] | None:
    """A step's repeat (its again, replay.py) from what its last run kept, (inputs, output, job): the job (a bound
    call, crew.Bound) and the output, where these are the very inputs and that output is still the planned buffer;
    None otherwise."""
    if kept is None or kept[1] is not planned or len(inputs) != len(kept[0]) or not all(map(same, inputs, kept[0])):
        return None
    return kept[2], kept[1]


def image_blocks(a: np.ndarray) -> bool:
    """Whether a is contiguous, or a batch of contiguous blocks one after another in order (a piece of a
    contiguous batch cut along a later axis): what a conv's layout reads as it is (ops/direct.py)."""
    if a.flags.c_contiguous:
        return True
    return a.ndim > 1 and a[0].flags.c_contiguous and a.strides[0] >= a[0].nbytes


def is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt in ML_FLOATS


def compute_dtype(dt: np.dtype) -> np.dtype:
    """The dtype arithmetic on `dt` is done in."""
    return F32 if dt == F16 or dt in ML_FLOATS else dt


def widen(x: np.ndarray) -> np.ndarray:
    dt = compute_dtype(x.dtype)
    return x if dt == x.dtype else x.astype(dt)


def matches(out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """The planned buffer when it fits this result exactly, else None."""
    if out is not None and out.shape == shape and out.dtype == dtype:
        return out
    return None


def float_compute_dtype(dt: np.dtype) -> np.dtype:
    """compute_dtype for kernels that take floats only (convs, pools): TypeError for any other dtype."""
    dt = np.dtype(dt)
    if not is_float(dt):
        raise TypeError(f"unsupported dtype {dt}")
    return compute_dtype(dt)


def out_buffer(planned: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The planned output buffer when it fits, else a fresh one."""
    out = matches(planned, tuple(shape), dtype)
    return np.empty(shape, dtype=dtype) if out is None else out


def stats_dtype(dtype: np.dtype) -> np.dtype:
    """Where a normalization computes its statistics: float64 for float64, float32 for float32 and the half types
    (the ONNX stash type); a TypeError for any other dtype."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return dtype
    if dtype == np.float32:
        return dtype
    if dtype.kind in "fV" or dtype.name == "bfloat16":
        return np.dtype(np.float32)
    raise TypeError(f"unsupported dtype {dtype}")


#: The compiled loops' "none" for an optional 2-D float32 input (a mask, a residual): no rows.
NO_ROWS = np.empty((0, 0), np.float32)
