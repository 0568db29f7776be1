"""Where each output position of a Resize samples its input, along one axis: ONNX's coordinate transforms (in
float32, in ONNX Runtime's order of operations, so that positions on exact integers round as it does), the nearest
roundings, and the linear and cubic windows (antialiased, excluding outside taps), as 1-D plans of source indices
and weights. The CPU's Resize applies them (backends/cpu/ops/resample.py); the GPU backends make their index and
weight tables from them.
"""

from __future__ import annotations

import math

import numpy as np

#: Follow the ONNX reference implementation instead of the spec text and ONNX Runtime for the output length
#: that align_corners and tf_crop_and_resize divide by, when scales (not sizes) are given. See _coords.
FRACTIONAL_OUTPUT_LENGTH = False

#: The periodic path is used while phases * taps stays at most this.
_MAX_PHASE_OPS = 48


class AxisPlan:
    """How one axis is resampled: out[o] = sum_t w[o, t] * in[idx[o, t]] (idx clamped), plus extrapolated positions."""

    __slots__ = ("axis", "L", "O", "idx", "raw", "w", "extrap", "period", "repeat")

    def __init__(self, axis: int, L: int, O: int, raw: np.ndarray, w: np.ndarray, extrap: np.ndarray | None):
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

    def _period(self) -> tuple[int, int, int, np.ndarray, np.ndarray] | None:
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


def _coords(mode: str, O: int, L: int, scale: float, roi: tuple[float, float] | None,
            sizes_given: bool) -> tuple[np.ndarray, np.ndarray | None]:
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
        if roi is None:
            raise ValueError("Resize with tf_crop_and_resize needs roi")
        start, end = f(roi[0]), f(roi[1])
        if out_w == 1:
            x = np.full(O, half * (start + end) * (Lf - one), f)
        else:
            x = start * (Lf - one) + y * (end - start) * (Lf - one) / (out_w - one)
        bad = (x < 0) | (x > Lf - one)
        extrap = bad if bad.any() else None
    else:
        raise ValueError(f"Resize coordinate_transformation_mode {mode!r} is not one ONNX defines")
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
