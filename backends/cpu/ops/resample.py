"""Separable resampling, as Resize (resize.py) uses it: each resized axis becomes a 1-D plan of source indices
and weights (aiomnn/sampling.py, made once per input shape and scales), applied one axis at a time. Three ways to apply a plan,
fastest first:

* repeat: nearest with an integer upscale on every resized axis (the usual
  FPN/YOLO upsample) is one copy into the output (upsample, a compiled loop, where
  it serves; else repeat, numpy's broadcast copy);
* periodic: when the weights repeat with a short period (integer or simple
  rational scales with half_pixel/asymmetric/... coordinates) each phase is
  a strided slice multiply-add, no gathers;
* general: np.take of each tap and a weighted sum.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from aiomnn.sampling import AxisPlan

from .. import jit
from ..threads import SLICE_ELEMENTS
from .dtypes import F32



def apply_axis(a: np.ndarray, p: AxisPlan, out: np.ndarray | None) -> np.ndarray:
    ax = p.axis
    shape = list(a.shape)
    shape[ax] = p.O
    if out is None:
        out = np.empty(shape, a.dtype)
    pre = (slice(None),) * ax
    if p.period is not None:
        m, p_out, p_in, offs, w = p.period
        lo = min(0, int(offs.min()))
        hi = max(p.L - 1, int(offs.max()) + (m - 1) * p_in)
        src = a
        if lo < 0 or hi > p.L - 1:
            # Edge-replicate so every tap is a plain strided slice.
            padded = list(a.shape)
            padded[ax] = hi - lo + 1
            src = np.empty(padded, a.dtype)
            src[pre + (slice(-lo, -lo + p.L),)] = a
            if lo < 0:
                src[pre + (slice(0, -lo),)] = a[pre + (slice(0, 1),)]
            if hi > p.L - 1:
                src[pre + (slice(-lo + p.L, None),)] = a[pre + (slice(p.L - 1, p.L),)]
        tmp = None
        for j in range(p_out):
            dst = out[pre + (slice(j, None, p_out),)]
            first = True
            for t in range(offs.shape[1]):
                wt = w[j, t]
                if wt == 0:
                    continue
                b = int(offs[j, t]) - lo
                sl = src[pre + (slice(b, b + (m - 1) * p_in + 1, p_in),)]
                if first:
                    if wt == 1:
                        np.copyto(dst, sl)
                    else:
                        np.multiply(sl, a.dtype.type(wt), out=dst)
                    first = False
                else:
                    if tmp is None or tmp.shape != dst.shape:
                        tmp = np.empty(dst.shape, a.dtype)
                    np.multiply(sl, a.dtype.type(wt), out=tmp)
                    dst += tmp
            if first:
                dst[...] = 0
        return out
    T = p.idx.shape[1]
    bshape = (1,) * ax + (p.O,) + (1,) * (a.ndim - ax - 1)
    if T == 1 and (p.w == 1).all():
        np.take(a, p.idx[:, 0], axis=ax, out=out)
        return out
    first = True
    for t in range(T):
        wt = p.w[:, t]
        if not wt.any():
            continue
        g = np.take(a, p.idx[:, t], axis=ax)
        g *= wt.astype(a.dtype).reshape(bshape)
        if first:
            np.copyto(out, g)
            first = False
        else:
            out += g
    if first:
        out[...] = 0
    return out


#: Nothing to add (loops.upsample's z).
_NOTHING = np.empty((0, 0, 0), F32)


def upsample(x: np.ndarray, z: np.ndarray | None, out: np.ndarray,
             reps: dict[int, int]) -> Callable[[], Any] | None:
    """out = a nearest upscale of x by whole factors (reps: axis -> factor) of its last two axes (+ z, of out's
    shape), for float32, by planes.upsample, rows of x shared by the pieces. Returns the same work as a call to make again
    (jit.split's), or None (nothing done) where it cannot serve or compiles."""
    arrays = (x, out) if z is None else (x, z, out)
    if x.ndim < 3 or not set(reps) <= {x.ndim - 2, x.ndim - 1} or any(
            a.dtype != F32 or not a.flags.c_contiguous for a in arrays):
        return None
    H, W = x.shape[-2:]
    xs, ys = x.reshape(-1, H, W), out.reshape(-1, H * reps.get(x.ndim - 2, 1), W * reps.get(x.ndim - 1, 1))
    zs = _NOTHING if z is None else z.reshape(ys.shape)
    fy, fx = reps.get(x.ndim - 2, 1), reps.get(x.ndim - 1, 1)
    return jit.split("upsample", xs.shape[0], max(1, SLICE_ELEMENTS // max(1, ys[0].size)), xs, zs, ys, fy, fx)


def repeat(x: np.ndarray, out: np.ndarray, reps: dict[int, int]) -> None:
    """A nearest upscale by whole factors (reps: axis -> factor) as one broadcast copy."""
    vshape, src_idx = [], []
    for a, d in enumerate(x.shape):
        vshape.append(d)
        src_idx.append(slice(None))
        if a in reps:
            vshape.append(reps[a])
            src_idx.append(None)
    dst = out.reshape(vshape)
    last = x.ndim - 1
    if last in reps:
        # One copy per phase of the last axis: a copy broadcast along a length-k innermost
        # axis would run numpy's inner loop k elements at a time.
        src = x[tuple(src_idx[:-1])]
        for j in range(reps[last]):
            np.copyto(dst[..., j], src)
    else:
        np.copyto(dst, x[tuple(src_idx)])
