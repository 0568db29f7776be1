"""Reductions over any set of axes, Softmax and LogSoftmax."""

from __future__ import annotations

import math

from aiomnn.shapes import reduce_axes
from aiomnn.strides import collapse, contiguous

from .base import Alias, Decline, In, Launch, Out, i32, meta, op, require_float

GROUP = 64  # work-group size of the *_wg kernels, as in kernels/reduce.cl
LONG = 256  # reductions at least this long get a work group each

REDUCE = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4, "ReduceSumSquare": 5,
          "ReduceL1": 6, "ReduceL2": 7, "ReduceLogSum": 8, "ReduceLogSumExp": 9}


def _reduce(name: str):
    def plan(ctx, node, ins, outs):
        x, y = ins[0], outs[0]
        require_float(x, y)
        rank = len(x.shape)
        try:
            axes = reduce_axes(node, ins, rank)
        except Exception:  # axes only known at run time
            raise Decline("axes must be constant") from None
        if not axes and rank:
            if node.attrs.get("noop_with_empty_axes", 0):
                return Alias(0)
            axes = list(range(rank))
        xs = contiguous(x.shape)
        kept = [d for d in range(rank) if d not in axes]
        kd, (ks,) = collapse([x.shape[d] for d in kept], [xs[d] for d in kept])
        rd, (rs,) = collapse([x.shape[d] for d in axes], [xs[d] for d in axes])
        n = math.prod(y.shape)
        count = math.prod(x.shape[d] for d in axes)
        args = [In(0), Out(0), meta(("reduce",), kd, ks, rd, rs), *i32(n, len(kd), len(rd), count, REDUCE[name])]
        if count >= LONG and n < count:  # few long reductions: a work group each
            return [Launch("reduce", "reduce_wg", args, (GROUP, n), local=(GROUP, 1))]
        return [Launch("reduce", "reduce", args, (n,))]

    return plan


for _name in REDUCE:
    op(_name, 1)(_reduce(_name))


def _softmax(log: int):
    def plan(ctx, node, ins, outs):
        x = ins[0]
        require_float(x, outs[0])
        rank = len(x.shape)
        if node.opset < 13:
            axis = node.attrs.get("axis", 1) % max(rank, 1)
            outer, length, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis:]), 1
        else:
            axis = node.attrs.get("axis", -1) % max(rank, 1)
            outer, length, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])
        if inner == 1 and length >= LONG:  # long contiguous rows: a work group each
            return [Launch("reduce", "softmax_rows", [In(0), Out(0), *i32(outer, length, log)], (GROUP, outer),
                           local=(GROUP, 1))]
        return [Launch("reduce", "softmax", [In(0), Out(0), *i32(outer, length, inner, log)], (inner, outer))]

    return plan


op("Softmax", 1)(_softmax(0))
op("LogSoftmax", 1)(_softmax(1))
