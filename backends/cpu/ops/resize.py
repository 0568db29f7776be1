"""Resize (opsets 10-19) and Upsample: the kernels, which read their arguments as each opset gives them and
apply the separable plans of resample.py.

Opset 10 Resize and Upsample use asymmetric coordinates; their nearest picks
floor when upsampling and ceil when downsampling, as ONNX Runtime does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aiomnn import sampling

from ..kernel import SLICE_ELEMENTS, Kernel, Unsupported, op, parallel_slices, threads
from . import resample
from .dtypes import out_buffer

_MODES = ("nearest", "linear", "cubic")
_COORDS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
           "tf_half_pixel_for_nn", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")

def _flat(v: Any) -> np.ndarray | None:
    if v is None:
        return None
    a = np.asarray(v).reshape(-1)
    return a if a.size else None


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
            plans.append(sampling.plan_axis(a, shape[a], out[a], scale[a], mode=self.mode, coord=self.coord,
                                            nearest=self.nearest, cubic_a=self.cubic_a,
                                            exclude_outside=self.exclude_outside, antialias=self.antialias,
                                            roi=rois[a], sizes_given=sizes_given))
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
            if resample.upsample(x, None, out, reps):
                return out
            # Slices of the first axis longer than one, if it comes before the first resized axis (batch or
            # channels): each slice of out is then contiguous, and reshapes as a view.
            axis = next((a for a, d in enumerate(x.shape) if d > 1), 0)
            pieces = min(threads(), out.size // SLICE_ELEMENTS, x.shape[axis])
            if pieces < 2 or axis >= min(reps):
                resample.repeat(x, out, reps)
                return out
            at = (slice(None),) * axis
            parallel_slices(x.shape[axis], pieces,
                            lambda rows: resample.repeat(x[at + (rows,)], out[at + (rows,)], reps))
            return out
        integer = x.dtype.kind in "iub"
        if self.mode == "nearest":
            a = x
            for i, p in enumerate(plans):
                last = i == len(plans) - 1
                a = resample.apply_axis(a, p, out if last else None)
            self._extrapolate(out, plans)
            return out
        cdt = np.dtype(np.float64) if x.dtype == np.float64 or integer else np.dtype(np.float32)
        a = x if x.dtype == cdt else x.astype(cdt)
        direct = cdt == x.dtype
        for i, p in enumerate(plans):
            last = i == len(plans) - 1
            a = resample.apply_axis(a, p, out if (last and direct) else None)
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
