"""Resize and Upsample."""

from __future__ import annotations

import numpy as np

from aiomnn import sampling

from ..launch import Grid
from .base import Decline, VkOp, const_value, data_input, numel, pack, register


@register("Resize", "Upsample")
class Resize(VkOp):
    """Resampling of the last two axes, with the core's tap plans (aiomnn/sampling.py: every backend rounds alike)."""

    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        shape = tuple(x.shape)
        if len(shape) < 2:
            raise Decline("rank")
        consts = [None if t is None else const_value(t) for t in inputs[1:]]  # roi, scales, sizes; or scales
        try:
            spec = sampling.Resampling.of(node.op_type, node.opset, node.attrs)
            taps = spec.plan(shape, *spec.arguments(*consts))
        except ValueError as exc:
            raise Decline(str(exc)) from None
        if tuple(taps.out_shape) != tuple(outputs[0].shape):
            raise Decline("output shape")
        r = len(shape)
        axes = {p.axis: p for p in taps.axes}
        if any(a < r - 2 for a in axes):
            raise Decline("resizes a leading axis")
        tables = []
        has_ex = False
        for a in (r - 2, r - 1):
            p = axes.get(a)
            if p is None:
                o = shape[a]
                tables.append((np.arange(o, dtype=np.int32).reshape(o, 1), np.ones((o, 1), np.float32),
                               np.zeros(o, np.int32)))
            else:
                ex = np.zeros(p.O, np.int32) if p.extrap is None else p.extrap.astype(np.int32)
                has_ex |= p.extrap is not None
                tables.append((p.idx.astype(np.int32), p.w.astype(np.float32), ex))
        self.tables = tables
        self.has_ex = has_ex
        self.ex_value = spec.extrapolation_value
        self.geo = (numel(shape[:-2]), shape[-2], shape[-1], outputs[0].shape[-2], outputs[0].shape[-1])

    def factors(self) -> tuple[int, int] | None:
        """(fh, fw) where this is a nearest upsampling by whole factors (output pixel (y, x) is input pixel
        (y // fh, x // fw)), else None."""
        _, h, w, oh, ow = self.geo
        out = []
        for (idx, wt, _), i, o in zip(self.tables, (h, w), (oh, ow)):
            if self.has_ex or idx.shape[1] != 1 or not i or o % i or np.any(wt != 1):
                return None
            if not np.array_equal(idx[:, 0], np.arange(o) // (o // i)):
                return None
            out.append(o // i)
        return out[0], out[1]

    def on_plan(self, inputs, outputs):
        nc, h, w, oh, ow = self.geo
        parts, offs = [], []
        n = 0
        for idx, wt, ex in self.tables:
            for arr in (idx.reshape(-1), wt.reshape(-1).view(np.int32), ex):
                offs.append(n)
                parts.append(arr.astype(np.int32, copy=False))
                n += arr.size
        parts.append(np.array([self.ex_value], np.float32).view(np.int32))  # the extrapolation value's bits, last
        table = self.plan.aux(np.concatenate(parts))
        th, tw = self.tables[0][0].shape[1], self.tables[1][0].shape[1]
        fh, fw = self.factors() or (0, 0)
        push = pack(nc, h, w, oh, ow, th, tw, *offs, int(self.has_ex), n, fh, fw)
        self.dispatch("resize", [self.out_locs[0], self.loc(inputs[0]), table], push, Grid(nc * oh * ow))
