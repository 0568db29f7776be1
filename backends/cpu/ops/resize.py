"""Resize (opsets 10-19) and Upsample.

Interpolation is separable: each resized axis becomes a 1-D plan of source
indices and weights (computed once per input shape and scales), applied one
axis at a time. Three ways to apply a plan, fastest first:

* repeat: nearest with an integer upscale on every resized axis (the usual
  FPN/YOLO upsample) is one broadcast copy into the output;
* periodic: when the weights repeat with a short period (integer or simple
  rational scales with half_pixel/asymmetric/... coordinates) each phase is
  a strided slice multiply-add, no gathers;
* general: np.take of each tap and a weighted sum.

Opset 10 Resize and Upsample use asymmetric coordinates; their nearest picks
floor when upsampling and ceil when downsampling, as ONNX Runtime does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import jit
from ..kernel import SLICE_ELEMENTS, Kernel, Unsupported, op, parallel_slices, threads
from .dtypes import F32, out_buffer

_MODES = ("nearest", "linear", "cubic")
_COORDS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
           "tf_half_pixel_for_nn", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")

#: Follow the ONNX reference implementation instead of the spec text and ONNX Runtime for the output length
#: that align_corners and tf_crop_and_resize divide by, when scales (not sizes) are given. See _coords.
FRACTIONAL_OUTPUT_LENGTH = False

#: The periodic path is used while phases * taps stays at most this.
_MAX_PHASE_OPS = 48


def _flat(v: Any) -> np.ndarray | None:
    if v is None:
        return None
    a = np.asarray(v).reshape(-1)
    return a if a.size else None


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


def _apply_axis(a: np.ndarray, p: AxisPlan, out: np.ndarray | None) -> np.ndarray:
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


def _repeat(x: np.ndarray, out: np.ndarray, reps: dict[int, int]) -> None:
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


class _ResizeBase(Kernel):
    writes_outputs = True

    def _setup(self, mode, coord, nearest, cubic_a, exclude_outside, extrapolation_value, antialias, axes, policy):
        if mode not in _MODES:
            raise Unsupported(f"mode {mode!r}")
        if coord not in _COORDS:
            raise Unsupported(f"coordinate_transformation_mode {coord!r}")
        if nearest not in _NEAREST:
            raise Unsupported(f"nearest_mode {nearest!r}")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise Unsupported(f"keep_aspect_ratio_policy {policy!r}")
        if antialias and mode == "nearest":
            antialias = 0  # antialias applies to linear and cubic only
        self.mode, self.coord, self.nearest = mode, coord, nearest
        self.cubic_a, self.exclude_outside = float(cubic_a), bool(exclude_outside)
        self.extrapolation_value = float(extrapolation_value)
        self.antialias, self.axes, self.policy = bool(antialias), axes, policy
        self._key = None
        self._plan = None

    def _make_plan(self, shape, scales, sizes, roi):
        r = len(shape)
        key = (shape, None if scales is None else scales.tobytes(), None if sizes is None else sizes.tobytes(),
               None if roi is None else roi.tobytes())
        if key == self._key:
            return self._plan
        axes = [a % r for a in self.axes] if self.axes else list(range(r))
        if len(set(axes)) != len(axes):
            raise ValueError(f"Resize axes {self.axes} repeat an axis")
        k = len(axes)
        out = list(shape)
        scale = [1.0] * r
        sizes_given = sizes is not None
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
        rois = [None] * r
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
            ident = out[a] == shape[a] and math.isclose(scale[a], 1.0) and (
                rois[a] is None or (math.isclose(rois[a][0], 0.0) and math.isclose(rois[a][1], 1.0)))
            if ident or out[a] == 0 or shape[a] == 0:
                continue
            plans.append(plan_axis(a, shape[a], out[a], scale[a], mode=self.mode, coord=self.coord,
                                   nearest=self.nearest, cubic_a=self.cubic_a, exclude_outside=self.exclude_outside,
                                   antialias=self.antialias, roi=rois[a], sizes_given=sizes_given))
        # Shrinking axes first keeps the intermediates small.
        plans.sort(key=lambda p: p.O / p.L)
        plan = dict(out_shape=tuple(out), axes=plans,
                    repeat=bool(plans) and all(p.repeat for p in plans))
        self._key, self._plan = key, plan
        return plan

    def resize(self, x, scales, sizes, roi):
        plan = self._make_plan(tuple(x.shape), scales, sizes, roi)
        shape = plan["out_shape"]
        out = out_buffer(self.out[0], shape, x.dtype)
        if 0 in shape or 0 in x.shape:
            return np.zeros(shape, x.dtype) if out.size == 0 or 0 in x.shape else out
        plans = plan["axes"]
        if not plans:
            np.copyto(out, x)
            return out
        if plan["repeat"]:
            reps = {p.axis: p.repeat for p in plans}
            if upsample(x, None, out, reps):
                return out
            # Slices of the first axis longer than one, if it comes before the first resized axis (batch or
            # channels): each slice of out is then contiguous, and reshapes as a view.
            axis = next((a for a, d in enumerate(x.shape) if d > 1), 0)
            pieces = min(threads(), out.size // SLICE_ELEMENTS, x.shape[axis])
            if pieces < 2 or axis >= min(reps):
                _repeat(x, out, reps)
                return out
            at = (slice(None),) * axis
            parallel_slices(x.shape[axis], pieces, lambda rows: _repeat(x[at + (rows,)], out[at + (rows,)], reps))
            return out
        integer = x.dtype.kind in "iub"
        if self.mode == "nearest":
            a = x
            for i, p in enumerate(plans):
                last = i == len(plans) - 1
                a = _apply_axis(a, p, out if last else None)
            self._extrapolate(out, plans)
            return out
        cdt = np.dtype(np.float64) if x.dtype == np.float64 or integer else np.dtype(np.float32)
        a = x if x.dtype == cdt else x.astype(cdt)
        direct = cdt == x.dtype
        for i, p in enumerate(plans):
            last = i == len(plans) - 1
            a = _apply_axis(a, p, out if (last and direct) else None)
        self._extrapolate(a, plans)
        if direct:
            return a
        if integer:
            info = np.iinfo(x.dtype)
            a = np.clip(np.round(a), info.min, info.max)
        out[...] = a
        return out

    def factors(self, *inputs: Any) -> dict[int, int] | None:
        """For the inputs of a run: the whole factor of each resized axis (axis -> factor) where the resize is a
        nearest upscale by whole factors, else None."""
        x, scales, sizes, roi = self._arguments(*inputs)
        plan = self._make_plan(tuple(x.shape), scales, sizes, roi)
        return {p.axis: p.repeat for p in plan["axes"]} if plan["repeat"] else None

    def run(self, *inputs):
        return self.resize(*self._arguments(*inputs))

    def _extrapolate(self, y, plans):
        masks = [p for p in plans if p.extrap is not None]
        if not masks:
            return
        mask = np.zeros((1,) * y.ndim, bool)
        for p in masks:
            mask = mask | p.extrap.reshape((1,) * p.axis + (-1,) + (1,) * (y.ndim - p.axis - 1))
        np.copyto(y, y.dtype.type(self.extrapolation_value), where=np.broadcast_to(mask, y.shape))


@op("Resize", 11)
class Resize(_ResizeBase):
    def __init__(self, node, inputs, outputs, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
                 cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
                 mode="nearest", nearest_mode="round_prefer_floor"):
        super().__init__(node, inputs, outputs)
        self._setup(mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a, exclude_outside,
                    extrapolation_value, antialias, axes, keep_aspect_ratio_policy)

    def _arguments(self, x, roi=None, scales=None, sizes=None):
        """The input, scales, sizes and roi of a run, as resize takes them."""
        sizes = _flat(sizes)
        scales = None if sizes is not None else _flat(scales)
        if sizes is not None:
            sizes = sizes.astype(np.int64)
        if scales is not None:
            scales = scales.astype(np.float64)
        roi = _flat(roi)
        if roi is not None:
            roi = roi.astype(np.float64)
        return x, scales, sizes, roi


class _Asymmetric(_ResizeBase):
    """Resize-10 and Upsample: asymmetric coordinates, nearest or (bi)linear."""

    def _init(self, mode):
        if mode == "bilinear":
            mode = "linear"
        self._setup(mode, "asymmetric", "simple", -0.75, 0, 0.0, 0, None, "stretch")

    def _arguments(self, x, scales=None):
        s = self.scales if scales is None else _flat(scales)
        if s is None:
            raise ValueError(f"{self.node.op_type} needs scales")
        return x, np.asarray(s, np.float64), None, None


@op("Resize", 10)
class Resize10(_Asymmetric):
    def __init__(self, node, inputs, outputs, mode="nearest"):
        super().__init__(node, inputs, outputs)
        self._init(mode)
        self.scales = None


@op("Upsample", 1)
class Upsample1(_Asymmetric):
    def __init__(self, node, inputs, outputs, height_scale=None, mode="nearest", width_scale=None):
        super().__init__(node, inputs, outputs)
        if height_scale is None or width_scale is None:
            raise Unsupported("Upsample-1 needs height_scale and width_scale")
        self._init(mode)
        self.scales = [1.0, 1.0, float(height_scale), float(width_scale)]


@op("Upsample", 7)
class Upsample7(_Asymmetric):
    def __init__(self, node, inputs, outputs, mode="nearest", scales=None):
        super().__init__(node, inputs, outputs)
        if scales is None:
            raise Unsupported("Upsample-7 needs scales")
        self._init(mode)
        self.scales = [float(s) for s in scales]


@op("Upsample", 9)
class Upsample9(_Asymmetric):
    def __init__(self, node, inputs, outputs, mode="nearest"):
        super().__init__(node, inputs, outputs)
        self._init(mode)
        self.scales = None
