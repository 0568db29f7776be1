"""Resize and Upsample of the last two dims, nearest and (bi)linear, in every
coordinate mode but tf_crop_and_resize. Index and weight tables are made on
the host, following the ONNX definitions."""

from __future__ import annotations

import math

import numpy as np

from ..kernel import Const, Decline, In, Launch, Out, i32, op, require_float


def _str(v, default: str) -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def source_coords(mode: str, out_len: int, in_len: int, scale: float) -> np.ndarray:
    """Where each output index samples the input, in input coordinates."""
    o = np.arange(out_len, dtype=np.float64)
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_len)
    if mode == "align_corners":
        return o * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros(out_len)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        center = in_len / 2
        offset = center * (1 - adjustment)
        return offset + (o + 0.5) / scale - 0.5
    raise Decline(f"coordinate mode {mode}")


def nearest_table(x: np.ndarray, rounding: str, in_len: int) -> np.ndarray:
    if rounding == "round_prefer_floor":
        i = np.ceil(x - 0.5)
    elif rounding == "round_prefer_ceil":
        i = np.floor(x + 0.5)
    elif rounding == "floor":
        i = np.floor(x)
    elif rounding == "ceil":
        i = np.ceil(x)
    else:
        raise Decline(f"nearest mode {rounding}")
    return np.clip(i, 0, in_len - 1).astype(np.int32)


def linear_table(x: np.ndarray, in_len: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.clip(x, 0, in_len - 1)
    i0 = np.floor(x)
    w = (x - i0).astype(np.float32)
    i0 = i0.astype(np.int32)
    i1 = np.minimum(i0 + 1, in_len - 1).astype(np.int32)
    return np.stack([i0, i1], axis=1).reshape(-1).copy(), w


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
    if _str(node.attrs.get("keep_aspect_ratio_policy"), "stretch") != "stretch":
        raise Decline("keep_aspect_ratio_policy")
    for a in range(rank):
        out[a] = y_shape[a] / x_shape[a]
    return out


def _plan(ctx, node, ins, outs):
    x, y = ins[0], outs[0]
    require_float(x, y)
    if len(x.shape) not in (3, 4):
        raise Decline("rank")
    mode = _str(node.attrs.get("mode"), "nearest")
    coord = _str(node.attrs.get("coordinate_transformation_mode"), "asymmetric" if node.opset < 11 else "half_pixel")
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
    cy = source_coords(coord, oh, h, sh)
    cx = source_coords(coord, ow, w, sw)
    key = ("resize", coord, mode, h, w, oh, ow, sh, sw)
    dims = i32(nc, h, w, oh, ow)
    if mode == "nearest":
        rounding = _str(node.attrs.get("nearest_mode"), "round_prefer_floor")
        if node.opset < 11:
            rounding = "floor"
        ty, tx = nearest_table(cy, rounding, h), nearest_table(cx, rounding, w)
        args = [In(0), Out(0), Const(key + (rounding, "y"), lambda: ty), Const(key + (rounding, "x"), lambda: tx),
                *dims]
        return [Launch("resize", "resize_nearest", args, (ow, oh, nc))]
    ry, wy = linear_table(cy, h)
    rx, wx = linear_table(cx, w)
    args = [In(0), Out(0), Const(key + ("ry",), lambda: ry), Const(key + ("wy",), lambda: wy),
            Const(key + ("rx",), lambda: rx), Const(key + ("wx",), lambda: wx), *dims]
    return [Launch("resize", "resize_linear", args, (ow, oh, nc))]


op("Resize", 10)(_plan)
op("Upsample", 7)(_plan)
