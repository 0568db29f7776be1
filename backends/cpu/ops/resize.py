"""Resize (opsets 10-19) and Upsample: the kernels, which take their settings, arguments and per-axis plans from
the core (aiomnn/sampling.py, as every backend does) and apply them with resample.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aiomnn import sampling

from ..execution import CpuOp, Unsupported, op

from ..threads import SLICE_ELEMENTS, parallel_slices, threads
from . import resample
from .dtypes import out_buffer, repeat_of


class _ResizeBase(CpuOp):
    """Resize and Upsample of every opset: the core's settings (sampling.Resampling) read from the node, the plan
    of the last input shape, scales, sizes and roi kept, and applied here."""

    writes_outputs = True

    def __init__(self, node, inputs, outputs, **attrs):
        super().__init__(node, inputs, outputs)
        try:
            # The kernels name their attributes (so that an unknown one is an error) with None for absent: the
            # defaults are Resampling's, by opset.
            given = {name: value for name, value in attrs.items() if value is not None}
            self.spec = sampling.Resampling.of(node.op_type, node.opset, given)
        except ValueError as exc:
            raise Unsupported(str(exc)) from None
        self.mode = self.spec.mode
        self._key: Any = None
        self._plan: sampling.ResizePlan | None = None
        self._kept: Any = None  # the last run's inputs, output and compiled job (resize puts the job alone here)

    def _arguments(self, x, *rest):
        """The input, scales, sizes and roi of a run, as resize takes them."""
        return (x, *self.spec.arguments(*rest))

    def _make_plan(self, shape, scales, sizes, roi) -> sampling.ResizePlan:
        key = (shape, None if scales is None else scales.tobytes(), None if sizes is None else sizes.tobytes(),
               None if roi is None else roi.tobytes())
        if key != self._key or self._plan is None:
            self._plan, self._key = self.spec.plan(shape, scales, sizes, roi), key
        return self._plan

    def resize(self, x, scales, sizes, roi):
        plan = self._make_plan(tuple(x.shape), scales, sizes, roi)
        shape = plan.out_shape
        out = out_buffer(self.out[0], shape, x.dtype)
        if 0 in shape or 0 in x.shape:
            return np.zeros(shape, x.dtype) if out.size == 0 or 0 in x.shape else out
        plans = plan.axes
        if not plans:
            np.copyto(out, x)
            return out
        reps = plan.factors
        if reps is not None:
            job = resample.upsample(x, None, out, reps)
            if job:
                self._kept = job
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
        return plan.factors

    def run(self, *inputs):
        self._kept = None
        out = self.resize(*self._arguments(*inputs))
        # The upscale's job, where it was all the run did, repeats on this input while the model fixes the rest
        # (the scales, sizes and roi it was bound to).
        self._kept = (inputs, out, self._kept) if self._kept is not None and all(self.fixed[1:]) else None
        return out

    def again(self, inputs: list[Any]) -> tuple[Any, np.ndarray] | None:
        """The nearest upscale's job of the last run, where these are its very inputs (replay.py)."""
        return repeat_of(self._kept, inputs, self.out[0])

    def _extrapolate(self, y, plans):
        masks = [p for p in plans if p.extrap is not None]
        if not masks:
            return
        mask = np.zeros((1,) * y.ndim, bool)
        for p in masks:
            mask = mask | p.extrap.reshape((1,) * p.axis + (-1,) + (1,) * (y.ndim - p.axis - 1))
        np.copyto(y, y.dtype.type(self.spec.extrapolation_value), where=np.broadcast_to(mask, y.shape))


@op("Resize", 11)
class Resize(_ResizeBase):
    def __init__(self, node, inputs, outputs, antialias=None, axes=None, coordinate_transformation_mode=None,
                 cubic_coeff_a=None, exclude_outside=None, extrapolation_value=None, keep_aspect_ratio_policy=None,
                 mode=None, nearest_mode=None):
        super().__init__(node, inputs, outputs, antialias=antialias, axes=axes,
                         coordinate_transformation_mode=coordinate_transformation_mode, cubic_coeff_a=cubic_coeff_a,
                         exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
                         keep_aspect_ratio_policy=keep_aspect_ratio_policy, mode=mode, nearest_mode=nearest_mode)


@op("Resize", 10)
@op("Upsample", 9)
class Resize10(_ResizeBase):
    """Resize-10 and Upsample-9: asymmetric coordinates, their scales an input."""

    def __init__(self, node, inputs, outputs, mode=None):
        super().__init__(node, inputs, outputs, mode=mode)


@op("Upsample", 1)
class Upsample1(_ResizeBase):
    def __init__(self, node, inputs, outputs, height_scale=None, mode=None, width_scale=None):
        super().__init__(node, inputs, outputs, height_scale=height_scale, mode=mode, width_scale=width_scale)


@op("Upsample", 7)
class Upsample7(_ResizeBase):
    def __init__(self, node, inputs, outputs, mode=None, scales=None):
        super().__init__(node, inputs, outputs, mode=mode, scales=scales)
