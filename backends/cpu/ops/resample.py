"""Separable resampling, as Resize (resize.py) uses it: each resized axis becomes a 1-D plan of source indices
and weights (computed once per input shape and scales), applied one axis at a time. Three ways to apply a plan,
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

import math
import numpy as np

from .. import jit
from ..kernel import SLICE_ELEMENTS, Unsupported
from .dtypes import F32

#: Follow the ONNX reference implementation instead of the spec text and ONNX Runtime for the output length
#: that align_corners and tf_crop_and_resize divide by, when scales (not sizes) are given. See _coords.
FRACTIONAL_OUTPUT_LENGTH = False

#: The periodic path is used while phases * taps stays at most this.
_MAX_PHASE_OPS = 48


class AxisPlan:
    """How one axis is resampled: out[o] = sum_t w[o, t] * in[idx[o, t]] (idx clamped), plus extrapolated positions."""

    __slots__ = ("axis", "L", "O", "idx", "raw", "w", "extrap", "period", "repeat")

    def __init__(self, axis, L, O, raw, w, extrap):
        self.axis, self.L, self.O = axis, L, O
        self.raw = raw  # (O, T) unclamped source indices
        self.idx = np.clip(raw, 0, L - 1).astype(np.intp)
        self.w = w  # (O, T) float64
        self.extrap = extrap  # (O,) bool or None
        self.repeat = self._repeat()
        self.period = None if self.repeat else self._period()

    def _repeat(self) -> int | None:
        """k when this axis is a nearest upscale by the integer k: out[o] = in[o // k]."""
        if self.w.shape[1] != 1 or self.O % self.L or self.extrap is not None:
            return None
        k = self.O // self.L
        return k if np.array_equal(self.idx[:, 0], np.arange(self.O) // k) else None

    def _period(self):
        """(m, p_out, p_in, offsets (p_out, T), weights (p_out, T)) when idx/w repeat every p_out outputs."""
        if self.extrap is not None:
            return None
        m = math.gcd(self.O, self.L)
        p_out, p_in = self.O // m, self.L // m
        T = self.w.shape[1]
        if p_out * T > _MAX_PHASE_OPS:
            return None
        raw = self.raw.reshape(m, p_out, T)
        w = self.w.reshape(m, p_out, T)
        offs = raw - (np.arange(m) * p_in)[:, None, None]
        if not (offs == offs[:1]).all() or not (w == w[:1]).all():
            return None
        return m, p_out, p_in, offs[0], w[0]


def _coords(mode: str, O: int, L: int, scale: float, roi: tuple[float, float] | None, sizes_given: bool):
    """x_original for every output position along one axis, and the extrapolation mask.

    Computed in float32 with ONNX Runtime's order of operations, so that positions landing
    on exact integers round the same way (nearest floor/ceil are sensitive to the last bit).
    """
    f = np.float32
    y = np.arange(O, dtype=f)
    sc = f(scale)
    Lf = f(L)
    # align_corners and tf_crop_and_resize divide by (length_resized - 1). The spec's length_resized is the
    # integer output length, as ONNX Runtime uses; the ONNX reference implementation (and so two of its
    # test cases, *downsample_scales_*_align_corners) uses the fractional scale * length instead.
    out_w = sc * Lf if FRACTIONAL_OUTPUT_LENGTH and not sizes_given else f(O)
    one, half = f(1), f(0.5)
    extrap = None
    if mode == "half_pixel":
        x = (y + half) / sc - half
    elif mode == "half_pixel_symmetric":
        adjustment = f(O) / (sc * Lf)
        offset = (Lf / f(2)) * (one - adjustment)
        x = offset + (y + half) / sc - half
    elif mode == "pytorch_half_pixel":
        x = (y + half) / sc - half if O > 1 else np.zeros(O, f)
    elif mode == "align_corners":
        x = np.zeros(O, f) if out_w == 1 else y * (Lf - one) / (out_w - one)
    elif mode == "asymmetric":
        x = y / sc
    elif mode == "tf_half_pixel_for_nn":
        x = (y + half) / sc
    elif mode == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if out_w == 1:
            x = np.full(O, half * (start + end) * (Lf - one), f)
        else:
            x = start * (Lf - one) + y * (end - start) * (Lf - one) / (out_w - one)
        bad = (x < 0) | (x > Lf - one)
        extrap = bad if bad.any() else None
    else:
        raise Unsupported(f"coordinate_transformation_mode {mode!r}")
    return x.astype(np.float64), extrap


def _keys(t: np.ndarray, a: float) -> np.ndarray:
    """The cubic convolution kernel (Keys) with coefficient a, at distances t >= 0."""
    t2, t3 = t * t, t * t * t
    inner = (a + 2) * t3 - (a + 3) * t2 + 1
    outer = a * t3 - 5 * a * t2 + 8 * a * t - 4 * a
    return np.where(t <= 1, inner, np.where(t < 2, outer, 0.0))


def plan_axis(axis: int, L: int, O: int, scale: float, *, mode: str, coord: str, nearest: str, cubic_a: float,
              exclude_outside: bool, antialias: bool, roi: tuple[float, float] | None, sizes_given: bool) -> AxisPlan:
    x, extrap = _coords(coord, O, L, scale, roi, sizes_given)
    if mode == "nearest":
        if nearest == "round_prefer_floor":
            i = np.ceil(x - 0.5)
        elif nearest == "round_prefer_ceil":
            i = np.floor(x + 0.5)
        elif nearest == "floor":
            i = np.floor(x)
        elif nearest == "ceil":
            i = np.ceil(x)
        else:  # "simple" (opset 10 and Upsample): ceil when downsampling, floor otherwise
            i = np.ceil(x) if scale < 1 else np.floor(x)
        # Exact integers stay themselves whatever the rounding (x == 2.0 → 2).
        i = np.where(x == np.round(x), np.round(x), i)
        return AxisPlan(axis, L, O, i.astype(np.int64).reshape(O, 1), np.ones((O, 1)), extrap)
    x0 = np.floor(x)
    ratio = x - x0
    # Prefer the pixel on the left: at an exact integer the window ends there (ratio 1).
    at_int = ratio == 0
    x0 = np.where(at_int, x0 - 1, x0)
    ratio = np.where(at_int, 1.0, ratio)
    support = 1 if mode == "linear" else 2
    s = min(scale, 1.0) if antialias else 1.0
    start = int(math.floor(-support / s) + 1)
    T = 2 - 2 * start
    offsets = np.arange(start, start + T, dtype=np.float64)
    t = np.abs(offsets[None, :] - ratio[:, None]) * s
    w = np.clip(1 - t, 0, 1) if mode == "linear" else _keys(t, cubic_a)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    raw = (x0[:, None] + offsets[None, :]).astype(np.int64)
    if exclude_outside:
        w = np.where((raw < 0) | (raw >= L), 0.0, w)
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    return AxisPlan(axis, L, O, raw, w, extrap)


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


def upsample(x: np.ndarray, z: np.ndarray | None, out: np.ndarray, reps: dict[int, int]) -> bool:
    """out = a nearest upscale of x by whole factors (reps: axis -> factor) of its last two axes (+ z, of out's
    shape), for float32, by loops.upsample, a row of x a piece; False (nothing done) where it cannot serve or
    compiles."""
    arrays = (x, out) if z is None else (x, z, out)
    if x.ndim < 3 or not set(reps) <= {x.ndim - 2, x.ndim - 1} or any(
            a.dtype != F32 or not a.flags.c_contiguous for a in arrays):
        return False
    H, W = x.shape[-2:]
    xs, ys = x.reshape(-1, H, W), out.reshape(-1, H * reps.get(x.ndim - 2, 1), W * reps.get(x.ndim - 1, 1))
    zs = _NOTHING if z is None else z.reshape(ys.shape)
    fy, fx = reps.get(x.ndim - 2, 1), reps.get(x.ndim - 1, 1)
    return jit.split("upsample", xs.shape[0], max(1, SLICE_ELEMENTS // max(1, ys[0].size)),
                     lambda fn, lo, hi: fn(xs, zs, ys, fy, fx, lo, hi)) is not None


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
