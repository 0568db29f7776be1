"""LayerNormalization, BatchNormalization (inference) and InstanceNormalization."""

from __future__ import annotations

import math

import numpy as np

from .base import Const, Decline, In, Launch, Out, const_value, f32, i32, op, require_float


@op("LayerNormalization", 17)
def layer_norm(ctx, node, ins, outs):
    x, y = ins[0], outs[0]
    bias = ins[2] if len(ins) > 2 and ins[2] is not None and ins[2].name else None
    require_float(x, ins[1], bias, y)
    axis = node.attrs.get("axis", -1) % len(x.shape)
    norm = tuple(x.shape[axis:])
    size = math.prod(norm)

    def expanded(t, what: str) -> Const:
        v = const_value(t, what).astype(np.float32)
        try:
            full = np.ascontiguousarray(np.broadcast_to(v, norm)).reshape(-1)
        except ValueError:
            raise Decline(f"{what} does not broadcast") from None
        return Const(("ln", node.name, what, id(t.const)), lambda: full, floats=True)

    scale = In(1) if ins[1].const is None and tuple(ins[1].shape) == norm else expanded(ins[1], "scale")
    if bias is None:
        b = Const(("zeros", size), lambda: np.zeros(size, np.float32), floats=True)
    else:
        b = In(2) if bias.const is None and tuple(bias.shape) == norm else expanded(bias, "bias")
    rows = math.prod(x.shape[:axis])
    eps = node.attrs.get("epsilon", 1e-5)
    wanted = [len(outs) > i and bool(outs[i].name) for i in (1, 2)]
    for i in (1, 2):
        if wanted[i - 1]:
            require_float(outs[i])
    stats = [Out(i) if wanted[i - 1] else Out(0) for i in (1, 2)]
    return [Launch("reduce", "layer_norm", [In(0), scale, b, Out(0), *stats, *i32(rows, size), *f32(eps),
                                            *i32(wanted[0] | wanted[1] << 1)], (rows,))]


@op("BatchNormalization", 7)
def batch_norm(ctx, node, ins, outs):
    x, y = ins[0], outs[0]
    if node.attrs.get("training_mode", 0) or any(o.name for o in outs[1:]):
        raise Decline("training mode")
    require_float(x, y, *ins[1:5])
    if len(x.shape) < 2:
        raise Decline("rank")
    c, n, inner = x.shape[1], math.prod(x.shape), math.prod(x.shape[2:])
    eps = node.attrs.get("epsilon", 1e-5)
    if any(t.const is None for t in ins[1:5]):
        return [Launch("reduce", "batch_norm", [In(0), In(1), In(2), In(3), In(4), Out(0), *i32(n, c, inner),
                                                *f32(eps)], (n,))]
    scale, bias, mean, var = (const_value(t, "BatchNormalization parameters").astype(np.float64) for t in ins[1:5])
    k = scale / np.sqrt(var + eps)
    k32, b32 = k.astype(np.float32), (bias - mean * k).astype(np.float32)
    key = ("bn", node.name, id(ins[1].const))
    return [Launch("reduce", "channel_affine",
                   [In(0), Const(key + ("k",), lambda: k32, floats=True), Const(key + ("b",), lambda: b32, floats=True),
                    Out(0), *i32(n, c, inner)], (n,))]


@op("InstanceNormalization", 6)
def instance_norm(ctx, node, ins, outs):
    x, y = ins[0], outs[0]
    require_float(x, ins[1], ins[2], y)
    if len(x.shape) < 3:
        raise Decline("rank")
    rows, c = x.shape[0] * x.shape[1], x.shape[1]
    eps = node.attrs.get("epsilon", 1e-5)
    return [Launch("reduce", "instance_norm",
                   [In(0), In(1), In(2), Out(0), *i32(rows, c, math.prod(x.shape[2:])), *f32(eps)], (rows,))]
