"""Where each output position of a Resize samples its input, along one axis: ONNX's coordinate transforms (in
float32, in ONNX Runtime's order of operations, so that positions on exact integers round as it does), the nearest
roundings, and the linear and cubic windows (antialiased, excluding outside taps), as 1-D plans of source indices
and weights. The CPU's Resize applies them (backends/cpu/ops/resample.py); the GPU backends make their index and
weight tables from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .graph import text

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


_MODES = ("nearest", "linear", "cubic")
_COORDS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
           "tf_half_pixel_for_nn", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")
_POLICIES = ("stretch", "not_larger", "not_smaller")


def _flat(v: Any) -> np.ndarray | None:
    if v is None:
        return None
    a = np.asarray(v).reshape(-1)
    return a if a.size else None


@dataclass(frozen=True)
class ResizePlan:
    """What one input shape and its scales, sizes and roi make: the output shape and a plan per resized axis
    (shrinking ones first, which keeps the intermediates small); where every one is a whole-factor nearest
    upscale, factors: each resized axis's factor (axis -> factor), else None."""

    out_shape: tuple[int, ...]
    axes: list[AxisPlan]
    factors: dict[int, int] | None


@dataclass(frozen=True)
class Resampling:
    """A Resize or Upsample node's settings as each opset gives them, and the plans they make. Opset-10 Resize and
    Upsample use asymmetric coordinates and ONNX Runtime's nearest rounding (floor up, ceil down: "simple"), and
    read their scales from an input or, Upsample-1 and -7, from attributes (`scales`)."""

    mode: str
    coord: str
    nearest: str
    cubic_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False
    axes: tuple[int, ...] | None = None
    policy: str = "stretch"
    scales: tuple[float, ...] | None = None  # Upsample-1 and -7: from attributes
    asymmetric: bool = False  # Resize-10 and Upsample: inputs (x, scales)

    @classmethod
    def of(cls, op_type: str, opset: int, attrs: Mapping[str, Any]) -> Resampling:
        """The settings of a node; ValueError for one ONNX does not define."""
        mode = text(attrs.get("mode"), "nearest")
        if op_type == "Upsample" or opset < 11:
            if mode == "bilinear":
                mode = "linear"
            scales: tuple[float, ...] | None = None
            if op_type == "Upsample" and opset < 7:
                if attrs.get("height_scale") is None or attrs.get("width_scale") is None:
                    raise ValueError("Upsample-1 needs height_scale and width_scale")
                scales = (1.0, 1.0, float(attrs["height_scale"]), float(attrs["width_scale"]))
            elif op_type == "Upsample" and opset < 9:
                if attrs.get("scales") is None:
                    raise ValueError("Upsample-7 needs scales")
                scales = tuple(float(s) for s in attrs["scales"])
            spec = cls(mode, "asymmetric", "simple", scales=scales, asymmetric=True)
        else:
            axes = attrs.get("axes")
            spec = cls(mode, text(attrs.get("coordinate_transformation_mode"), "half_pixel"),
                       text(attrs.get("nearest_mode"), "round_prefer_floor"),
                       float(attrs.get("cubic_coeff_a", -0.75)), bool(attrs.get("exclude_outside", 0)),
                       float(attrs.get("extrapolation_value", 0.0)),
                       bool(attrs.get("antialias", 0)) and mode != "nearest",  # linear and cubic only
                       None if axes is None else tuple(int(a) for a in axes),
                       text(attrs.get("keep_aspect_ratio_policy"), "stretch"))
        for value, allowed, what in ((spec.mode, _MODES, "mode"), (spec.coord, _COORDS, "coordinate_transformation_mode"),
                                     (spec.nearest, _NEAREST, "nearest_mode"),
                                     (spec.policy, _POLICIES, "keep_aspect_ratio_policy")):
            if value not in allowed:
                raise ValueError(f"{op_type} {what} {value!r}")
        return spec

    def arguments(self, *inputs: Any) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """(scales, sizes, roi) from the inputs after x, as this opset orders them (sizes win over scales)."""
        if self.asymmetric:
            s = self.scales if self.scales is not None else _flat(inputs[0] if inputs else None)
            if s is None:
                raise ValueError("Resize-10 and Upsample need scales")
            return np.asarray(s, np.float64), None, None
        roi, scales, sizes = (list(inputs) + [None] * 3)[:3]
        sizes = _flat(sizes)
        scales = None if sizes is not None else _flat(scales)
        roi = _flat(roi)
        return (None if scales is None else scales.astype(np.float64),
                None if sizes is None else sizes.astype(np.int64), None if roi is None else roi.astype(np.float64))

    def plan(self, shape: tuple[int, ...], scales: np.ndarray | None, sizes: np.ndarray | None,
             roi: np.ndarray | None) -> ResizePlan:
        """The output shape and per-axis plans for an input of this shape; ValueError where the arguments do not
        fit it."""
        r = len(shape)
        axes = [a % r for a in self.axes] if self.axes else list(range(r))
        if len(set(axes)) != len(axes):
            raise ValueError(f"Resize axes {self.axes} repeat an axis")
        k = len(axes)
        out = list(shape)
        scale = [1.0] * r
        if sizes is not None:
            if sizes.size != k:
                raise ValueError(f"Resize sizes {sizes.tolist()} do not fit axes {axes}")
            sz = [int(v) for v in sizes]
            if self.policy == "stretch":
                for i, a in enumerate(axes):
                    out[a] = sz[i]
                    scale[a] = sz[i] / shape[a] if shape[a] else 1.0
            else:
                ratios = [sz[i] / shape[a] for i, a in enumerate(axes)]
                s = min(ratios) if self.policy == "not_larger" else max(ratios)
                for a in axes:
                    out[a] = int(math.floor(s * shape[a] + 0.5))
                    scale[a] = s
        elif scales is not None:
            if scales.size != k:
                raise ValueError(f"Resize scales {scales.tolist()} do not fit axes {axes}")
            for i, a in enumerate(axes):
                s = float(scales[i])
                if s <= 0:
                    raise ValueError(f"Resize scale {s} is not positive")
                scale[a] = s
                out[a] = int(math.floor(shape[a] * s))
        else:
            raise ValueError("Resize needs either scales or sizes")
        rois: list[tuple[float, float] | None] = [None] * r
        if self.coord == "tf_crop_and_resize":
            if roi is None:
                raise ValueError("Resize with tf_crop_and_resize needs roi")
            if roi.size == 2 * k:
                for i, a in enumerate(axes):
                    rois[a] = (float(roi[i]), float(roi[k + i]))
            elif roi.size == 2 * r:
                for a in axes:
                    rois[a] = (float(roi[a]), float(roi[r + a]))
            else:
                raise ValueError(f"Resize roi of {roi.size} values for {k} axes")
        plans = []
        for a in range(r):
            crop = rois[a]
            ident = out[a] == shape[a] and math.isclose(scale[a], 1.0) and (
                crop is None or (math.isclose(crop[0], 0.0) and math.isclose(crop[1], 1.0)))
            if ident or out[a] == 0 or shape[a] == 0:
                continue
            plans.append(plan_axis(a, shape[a], out[a], scale[a], mode=self.mode, coord=self.coord,
                                   nearest=self.nearest, cubic_a=self.cubic_a, exclude_outside=self.exclude_outside,
                                   antialias=self.antialias, roi=crop, sizes_given=sizes is not None))
        plans.sort(key=lambda p: p.O / p.L)
        factors = {p.axis: p.repeat for p in plans if p.repeat}
        return ResizePlan(tuple(out), plans, factors if plans and len(factors) == len(plans) else None)
