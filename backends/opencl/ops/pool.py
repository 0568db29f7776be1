"""MaxPool, AveragePool (1-D and 2-D) and the global pools."""

from __future__ import annotations

import math

from aiomnn.window import window_params

from .base import Decline, In, Launch, Out, i32, op, require_float


def _pool(ctx, node, ins, outs, mode: int):
    x, y = ins[0], outs[0]
    require_float(x, y)
    if len(outs) > 1 and outs[1].name:
        raise Decline("MaxPool indices")
    if node.attrs.get("storage_order", 0):
        raise Decline("storage_order")
    rank = len(x.shape) - 2
    if rank not in (1, 2):
        raise Decline("only 1-D and 2-D pools")
    kernel, st, dil, pads = window_params(node, x.shape)
    if mode != 0 and any(d != 1 for d in dil):
        raise Decline("dilated average pool")
    if mode != 0 and node.attrs.get("count_include_pad", 0):
        mode = 2
    if rank == 1:
        kernel, st, dil, pads = [1] + kernel, [1] + st, [1] + dil, [0, pads[0], 0, pads[1]]
        n, c, h, w = x.shape[0], x.shape[1], 1, x.shape[2]
        oh, ow = 1, y.shape[2]
    else:
        n, c, h, w = x.shape
        oh, ow = y.shape[2:]
    args = [In(0), Out(0), *i32(n * c, h, w, oh, ow, *kernel, *st, pads[0], pads[1], pads[2], pads[3], *dil, mode)]
    return [Launch("pool", "pool2d", args, (ow, oh, n * c), tune=True)]


@op("MaxPool", 1)
def max_pool(ctx, node, ins, outs):
    return _pool(ctx, node, ins, outs, 0)


@op("AveragePool", 1)
def average_pool(ctx, node, ins, outs):
    return _pool(ctx, node, ins, outs, 1)


def _global(mode: int):
    def plan(ctx, node, ins, outs):
        x = ins[0]
        require_float(x, outs[0])
        nc, hw = x.shape[0] * x.shape[1], math.prod(x.shape[2:])
        return [Launch("pool", "global_pool", [In(0), Out(0), *i32(nc, hw, mode)], (64, nc), local=(64, 1))]

    return plan


op("GlobalMaxPool", 1)(_global(0))
op("GlobalAveragePool", 1)(_global(1))
