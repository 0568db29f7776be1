"""Resize and Upsample of the last two dims, nearest and (bi)linear, in every
coordinate mode but tf_crop_and_resize. Index and weight tables are made on
the host from the core's plans (aiomnn/sampling.py), as the CPU's Resize reads them."""

from __future__ import annotations

import math

import numpy as np

from aiomnn import sampling
from aiomnn.graph import text

from .base import Const, Decline, In, Launch, Out, i32, op, require_float


def _table(mode: str, coord: str, rounding: str, in_len: int, out_len: int, scale: float) -> tuple[np.ndarray, ...]:
    """The kernel's tables for one axis, from the core's plan (aiomnn/sampling.py): the input index of each output
    index (nearest), or the two it reads, flat, and the weight of the second (linear)."""
    try:
        p = sampling.plan_axis(0, in_len, out_len, scale, mode=mode, coord=coord, nearest=rounding, cubic_a=-0.75,
                               exclude_outside=False, antialias=False, roi=None, sizes_given=False)
    except ValueError as exc:
        raise Decline(str(exc)) from None
    if mode == "nearest":
        return (p.idx[:, 0].astype(np.int32),)
    return p.idx.astype(np.int32).reshape(-1).copy(), p.w[:, 1].astype(np.float32)


def _scales(node, ins, x_shape, y_shape) -> list[float]:
    """The scale of each dim: the scales input or attribute, else output size over input size."""
    rank = len(x_shape)
    if node.op_type == "Upsample" or node.opset < 11:
        scales = node.attrs.get("scales")
        if scales is None:
            t = ins[1]
            if t is None or t.const is None:
                raise Decline("scales must be constant")
            scales = np.asarray(t.const, dtype=np.float64).reshape(-1).tolist()
        return [float(s) for s in scales]
    scales_t = ins[2] if len(ins) > 2 else None
    axes = node.attrs.get("axes")
    axes = [a % rank for a in axes] if axes else list(range(rank))
    out = [1.0] * rank
    if scales_t is not None and scales_t.name and scales_t.const is not None and np.asarray(scales_t.const).size:
        vals = np.asarray(scales_t.const, dtype=np.float32).reshape(-1).tolist()  # ONNX scales are float32
        for a, s in zip(axes, vals):
            out[a] = float(s)
        return out
    if text(node.attrs.get("keep_aspect_ratio_policy"), "stretch") != "stretch":
        raise Decline("keep_aspect_ratio_policy")
    for a in range(rank):
        out[a] = y_shape[a] / x_shape[a]
    return out


def _plan(ctx, node, ins, outs):
    x, y = ins[0], outs[0]
    require_float(x, y)
    if len(x.shape) not in (3, 4):
        raise Decline("rank")
    mode = text(node.attrs.get("mode"), "nearest")
    coord = text(node.attrs.get("coordinate_transformation_mode"), "asymmetric" if node.opset < 11 else "half_pixel")
    if node.op_type == "Upsample" or node.opset < 11:
        coord = "asymmetric"
        if mode == "linear" or mode == "bilinear":
            mode = "linear"
    if node.attrs.get("antialias", 0) or coord == "tf_crop_and_resize":
        raise Decline("antialias or crop")
    if mode not in ("nearest", "linear"):
        raise Decline(f"mode {mode}")
    scales = _scales(node, ins, x.shape, y.shape)
    lead = len(x.shape) - 2
    if any(x.shape[d] != y.shape[d] for d in range(lead)):
        raise Decline("resizes a leading dim")
    nc = math.prod(x.shape[:lead])
    h, w = (1, x.shape[-1]) if len(x.shape) == 3 else x.shape[-2:]
    oh, ow = (1, y.shape[-1]) if len(y.shape) == 3 else y.shape[-2:]
    sh = 1.0 if len(x.shape) == 3 else scales[-2]
    sw = scales[-1]
    key = ("resize", coord, mode, h, w, oh, ow, sh, sw)
    dims = i32(nc, h, w, oh, ow)
    if mode == "nearest":
        rounding = "simple" if node.opset < 11 else text(node.attrs.get("nearest_mode"), "round_prefer_floor")
        (ty,), (tx,) = _table(mode, coord, rounding, h, oh, sh), _table(mode, coord, rounding, w, ow, sw)
        args = [In(0), Out(0), Const(key + (rounding, "y"), lambda: ty), Const(key + (rounding, "x"), lambda: tx),
                *dims]
        if ow % 4 == 0:
            return [Launch("resize", "resize_nearest4", args, (ow // 4, oh, nc))]
        return [Launch("resize", "resize_nearest", args, (ow, oh, nc))]
    ry, wy = _table(mode, coord, "", h, oh, sh)
    rx, wx = _table(mode, coord, "", w, ow, sw)
    args = [In(0), Out(0), Const(key + ("ry",), lambda: ry), Const(key + ("wy",), lambda: wy),
            Const(key + ("rx",), lambda: rx), Const(key + ("wx",), lambda: wx), *dims]
    return [Launch("resize", "resize_linear", args, (ow, oh, nc))]


op("Resize", 10)(_plan)
op("Upsample", 7)(_plan)
